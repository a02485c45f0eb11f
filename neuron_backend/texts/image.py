"""The image engine's messages: key -> (English, Arabic); {name} fields
are filled with the message's parameters (``neuron_backend.messages.msg``).

Field names inside messages (``err_image_field_*``) read exactly as the Image tab's labels
(ui/texts/image.py) in both languages, so a refusal names the control the visitor sees.
"""

MESSAGES: dict[str, tuple[str, str]] = {
    "image_stopped_before_start": ("Stopped before it started: no step ran and nothing was saved.",
                                   "أُوقِف قبل أن يبدأ: لم تُنفَّذ أي خطوة ولم يُحفَظ شيء."),
    # the request's values (image/inputs.py)
    "err_image_field_steps": ("Steps", "الخطوات"),
    "err_image_field_seed": ("Seed", "البذرة"),
    "err_image_field_count": ("Images per run", "عدد الصور في كل تشغيل"),
    "err_image_prompt_type": ("The prompt must be text, not {kind}.", "يجب أن يكون الموجّه نصًا، لا {kind}."),
    "err_image_prompt_empty": ("The prompt is empty: describe the image you want.",
                               "الموجّه فارغ: صِف الصورة التي تريدها."),
    "err_image_prompt_long": ("The prompt is {length} characters; the limit is {limit}. Shorten it.",
                              "طول الموجّه {length} حرفًا والحد الأقصى {limit}. اختصره."),
    "err_image_whole_type": ("{name} must be a whole number from {low} to {high}, not {value}.",
                             "يجب أن تكون قيمة «{name}» عددًا صحيحًا من {low} إلى {high}، لا {value}."),
    "err_image_whole_range": ("{name} {value} is out of range: use a whole number from {low} to {high}.",
                              "القيمة {value} لـ«{name}» خارج النطاق: استخدم عددًا صحيحًا من {low} إلى {high}."),
    "err_image_guidance_type": ("Guidance must be a number from {low} to {high}, not {value}.",
                                "يجب أن تكون «قوة التوجيه» عددًا من {low} إلى {high}، لا {value}."),
    "err_image_guidance_range": ("Guidance {value} is out of range: use {low} to {high}.",
                                 "قوة التوجيه {value} خارج النطاق: استخدم قيمة من {low} إلى {high}."),
    # sizes (shapes.py, engine.py)
    "err_size_malformed": ("Image size {text} is malformed: write it as WIDTHxHEIGHT, e.g. '1024x1024'.",
                           "مقاس الصورة {text} غير سليم الصيغة: اكتبه على هيئة العرضxالارتفاع، مثل '1024x1024'."),
    "err_size_invalid": ("Image size {size} is invalid: both sides must be multiples of {multiple} "
                         "between {multiple} and {max_side}.",
                         "مقاس الصورة {size} غير صالح: يجب أن يكون كل من الضلعين من مضاعفات {multiple} "
                         "بين {multiple} و{max_side}."),
    "err_size_allowed": ("{error} Allowed sizes: {allowed}.", "{error} المقاسات المسموح بها: {allowed}."),
    "err_size_not_served": ("Image size {size} is not served here (each size is compiled ahead of time). "
                            "Allowed sizes: {allowed}.",
                            "مقاس الصورة {size} غير متاح على هذا الخادم (كل مقاس يُترجَم مسبقًا). "
                            "المقاسات المسموح بها: {allowed}."),
    "err_prompt_bucket": ("The prompt is {tokens} tokens; the longest prompt this server accepts is "
                          "{limit} tokens. Shorten the message.",
                          "طول الموجّه {tokens} رمزًا (token)، وأطول موجّه يقبله هذا الخادم {limit} رمزًا. "
                          "اختصر الرسالة."),
    # the engine
    "err_image_not_loaded": ("The image model is not loaded yet; wait for the warm-up to load it.",
                             "لم يُحمَّل نموذج الصور بعد؛ انتظر حتى يحمّله الإحماء."),
    "err_image_load_failed": ("Could not load the image model {model} from {folder}: {cause}",
                              "تعذّر تحميل نموذج الصور {model} من {folder}: {cause}"),
    "image_guidance_ignored": ("guidance {value} ignored: {model} is step-distilled and runs without "
                               "classifier-free guidance",
                               "تُجوهِلت قوة التوجيه {value}: النموذج {model} مُقطَّر الخطوات (step-distilled) "
                               "ويعمل دون توجيه خالٍ من المصنِّف (classifier-free guidance)"),
    "image_not_saved_disabled": ("not saved: --max-saved-images is 0", "لم تُحفَظ: قيمة ‎--max-saved-images هي 0"),
    "image_not_saved_error": ("not saved: could not write to {folder} ({error})",
                              "لم تُحفَظ: تعذّرت الكتابة في {folder} ({error})"),
    # a dropped PNG (image/paste_back.py)
    "err_png_not_png": ("This file is not a PNG: drop a PNG made by this app or another image tool.",
                        "هذا الملف ليس PNG: أفلت ملف PNG صنعه هذا التطبيق أو أداة صور أخرى."),
    "err_png_too_big": ("This PNG is over {mb} MB; only smaller files are read.",
                        "حجم ملف PNG هذا يتجاوز {mb} ميغابايت؛ لا تُقرأ إلا الملفات الأصغر."),
    "err_png_no_params": ("This PNG has no generation parameters (no 'parameters' or 'showcase' text): "
                          "drop a PNG saved by this app or by an A1111-style tool.",
                          "لا يحوي ملف PNG هذا معاملات التوليد (لا نص 'parameters' ولا 'showcase'): "
                          "أفلت ملف PNG حفظه هذا التطبيق أو أداة بنمط A1111."),
    "err_png_settings_long": ("This PNG's settings line (the one starting 'Steps:') is {chars} characters long; "
                              "at most {limit} characters are read.",
                              "سطر الإعدادات في ملف PNG هذا (السطر الذي يبدأ بـ 'Steps:') طوله {chars} حرفًا؛ "
                              "ولا يُقرأ منه أكثر من {limit} حرف."),
    "err_png_no_size": ("This PNG does not say its size. Allowed sizes: {allowed}.",
                        "لا يذكر ملف PNG هذا مقاسه. المقاسات المسموح بها: {allowed}."),
    "err_png_size_not_served": ("This image is {size}, which is not served here (each size is compiled "
                                "ahead of time). Allowed sizes: {allowed}.",
                                "مقاس هذه الصورة {size}، وهو غير متاح على هذا الخادم (كل مقاس يُترجَم مسبقًا). "
                                "المقاسات المسموح بها: {allowed}."),
    "err_png_steps": ("This image used {steps} steps; this server allows 1 to {max_steps}.",
                      "استخدمت هذه الصورة {steps} خطوة؛ ويسمح هذا الخادم بـ1 إلى {max_steps}."),
    "image_png_seed_outside": ("seed {seed} is outside 0..{seed_max}: a random seed is used",
                               "البذرة {seed} خارج النطاق 0..{seed_max}: تُستخدم بذرة عشوائية"),
    "image_png_guidance_outside": ("guidance {value} is outside {low}..{high}: the default is used",
                                   "قوة التوجيه {value} خارج النطاق {low}..{high}: تُستخدم القيمة الافتراضية"),
}

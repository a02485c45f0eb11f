"""Messages every room may show (requests, engines, warm-up, the compile cache): key -> (English, Arabic); {name} fields
are filled with the message's parameters (``neuron_backend.messages.msg``)."""

MESSAGES: dict[str, tuple[str, str]] = {
    # engine names inside sentences (lower case in English, as the flags and logs spell them)
    "backend_engine_chat": ("chat", "المحادثة"),
    "backend_engine_image": ("image", "الصور"),
    "backend_kind_weights": ("weights", "الأوزان"),
    "backend_kind_load": ("load", "التحميل"),
    "backend_join_bar": ("{a} | {b}", "{a} | {b}"),
    "backend_join_dot": ("{a} · {b}", "{a} · {b}"),
    "backend_error_of": ("{kind}: {error}", "{kind}: {error}"),
    "backend_join_comma": ("{a}, {b}", "{a}، {b}"),
    "backend_join_semi": ("{a}; {b}", "{a}؛ {b}"),
    # which files a model needs and what is wrong with them (model_files.py)
    "backend_files_more": ("{shown} and {n} more", "{shown} و{n} غيرها"),
    "backend_files_model": ("model", "النموذج"),
    "backend_files_tokenizer": ("tokenizer", "المُرمِّز"),
    "backend_files_pipeline": ("pipeline index", "فهرس خط المعالجة (pipeline)"),
    "backend_files_config": ("{what} config", "إعدادات {what}"),
    "backend_files_settings": ("{what} settings", "ضبط {what}"),
    "backend_files_weights": ("{what} weights", "أوزان {what}"),
    "backend_files_index": ("{what} weight index", "فهرس أوزان {what}"),
    "backend_files_shard": ("{what} weight shard", "جزء من أوزان {what}"),
    "err_files_broken": ("{file}: {problem}", "{file}: {problem}"),
    "err_files_missing": ("{path}: missing ({why})", "{path}: مفقود ({why})"),
    "err_files_missing_folder": ("{path}: missing ({why}; the {top}/ folder is absent)",
                                 "{path}: مفقود ({why}؛ المجلد {top}/ غير موجود)"),
    "err_files_not_index": ("not a safetensors index (no weight_map: {error})",
                            "ليس فهرس safetensors (لا يحوي weight_map: {error})"),
    "err_files_bad_json": ("unreadable JSON ({error})", "ملف JSON غير مقروء ({error})"),
    "err_files_not_object": ("expected a JSON object, found {type}", "كان يُنتظر كائن JSON، فوُجد {type}"),
    "err_files_no_header": ("truncated ({size} bytes, not even a safetensors header)",
                            "مبتور ({size} بايت، ولا يتسع حتى لترويسة safetensors)"),
    "err_files_short_header": ("truncated ({size} bytes; its header alone declares {length})",
                               "مبتور ({size} بايت؛ وترويسته وحدها تعلن {length})"),
    "err_files_bad_header": ("corrupt safetensors header ({error})", "ترويسة safetensors تالفة ({error})"),
    "err_files_header_not_object": ("corrupt safetensors header (not a JSON object)",
                                    "ترويسة safetensors تالفة (ليست كائن JSON)"),
    "err_files_truncated": ("truncated ({size} bytes of {expected}; an interrupted download?)",
                            "مبتور ({size} بايت من {expected}؛ ربما انقطع تنزيله؟)"),
    # where the weights come from (model_sources.py): --models auto's reason, the weights task's errors
    "err_model_no_config": (
        "Model folder {path} has no config.json or model_index.json: "
        "point --chat-model/--image-model at a folder saved with save_pretrained().",
        "لا يحوي مجلد النموذج {path} الملف config.json ولا model_index.json: "
        "وجِّه --chat-model/--image-model إلى مجلد حُفظ بـ save_pretrained()."),
    "backend_model_local": ("local folder {folder}", "المجلد المحلي {folder}"),
    "backend_model_local_lacks": ("local folder {folder} lacks {n} needed file(s): {files}",
                                  "ينقص المجلد المحلي {folder} من الملفات اللازمة {n}: {files}"),
    "backend_model_cached": ("{model} is in the local Hugging Face cache",
                             "{model} موجود في الذاكرة المؤقتة المحلية لـ Hugging Face"),
    "backend_model_not_cached": ("is not in the local Hugging Face cache",
                                 "ليس في الذاكرة المؤقتة المحلية لـ Hugging Face"),
    "backend_model_cache_lacks": ("lacks {n} needed file(s) in the local Hugging Face cache ({files})",
                                  "ينقصه من الملفات اللازمة {n} في الذاكرة المؤقتة المحلية لـ Hugging Face ({files})"),
    "backend_model_will_download": ("{model} {where}; they will be downloaded ({hub})",
                                    "{model} {where}؛ وستُنزَّل ({hub})"),
    "backend_model_unavailable": ("{model} {where} and {hub}", "{model} {where}، و{hub}"),
    "backend_hub_offline": ("HF_HUB_OFFLINE is set", "المتغير HF_HUB_OFFLINE مضبوط"),
    "backend_hub_reachable": ("the Hub is reachable", "منصة Hub متاحة"),
    "backend_hub_unreachable": ("the Hub is unreachable ({kind})", "تعذّر الوصول إلى منصة Hub ‏({kind})"),
    "backend_hub_silent": ("the Hub did not answer within {timeout}s", "لم تُجب منصة Hub خلال {timeout} ث"),
    "err_model_damaged": (
        "{model} in {folder} has damaged or missing files: {problems}. Fetch them again (`{command}`) "
        "or pass a complete folder with {flag}.",
        "في {folder} ملفات تالفة أو مفقودة للنموذج {model}: {problems}. اجلبها من جديد (`{command}`) "
        "أو مرِّر مجلدًا كاملًا عبر {flag}."),
    "err_model_folder_lacks": (
        "Model folder {folder} lacks {n} needed file(s): {files}. Copy them in (e.g. hf download <repo> "
        "--local-dir <folder>) or point the flag at a complete folder.",
        "ينقص مجلد النموذج {folder} من الملفات اللازمة {n}: {files}. انسخها إليه (مثلًا "
        "`hf download <repo> --local-dir <folder>`) أو وجِّه الخيار إلى مجلد كامل."),
    "err_model_offline": (
        "{model}: {n} needed file(s) are not in the local Hugging Face cache ({files}) and HF_HUB_OFFLINE is set. "
        "Go online, or fetch them elsewhere with `{command}` and pass the folder with {flag}.",
        "{model}: من الملفات اللازمة {n} ليست في الذاكرة المؤقتة المحلية لـ Hugging Face ({files})، "
        "والمتغير HF_HUB_OFFLINE مضبوط. اتصل بالشبكة، أو اجلبها من مكان آخر بـ `{command}` ومرِّر المجلد عبر {flag}."),
    "err_model_stalled": (
        "Downloading {model} stalled: nothing arrived for {timeout} s ({amount}). Fetch it by hand with "
        "`{command}` and pass the folder with {flag}, or raise --download-stall-timeout.",
        "توقّف تنزيل {model}: لم يصل شيء منذ {timeout} ث ({amount}). نزِّله يدويًا بـ `{command}` "
        "ومرِّر المجلد عبر {flag}، أو ارفع --download-stall-timeout."),
    "backend_model_received": ("{done} GB received", "وصل {done} GB"),
    "backend_model_received_of": ("{done} GB of {total} GB received", "وصل {done} GB من {total} GB"),
    "err_model_download_failed": (
        "Could not download {model} ({kind}: {error}). Check the network or HF_TOKEN, or fetch it with "
        "`{command}` and pass the folder with {flag}; --models tiny runs the demo models.",
        "تعذّر تنزيل {model} ‏({kind}: {error}). تحقّق من الشبكة أو من HF_TOKEN، أو اجلبه بـ `{command}` "
        "ومرِّر المجلد عبر {flag}؛ والخيار --models tiny يشغّل النماذج التجريبية."),
    "err_model_hub_lacks": ("the Hub repository {model} lacks needed file(s): {files}",
                            "ينقص مستودع Hub ‏{model} ملفات لازمة: {files}"),
    "err_model_still_lacks": ("after the download {folder} still lacks {files}",
                              "بعد التنزيل ما زال ينقص {folder}: {files}"),
    # the compile cache folder (compile_cache.py; the details show it after "⚠")
    "backend_cache_not_writable": (
        "compile cache {folder} is not writable ({problem}); compiled programs are cached in {temp} for this run "
        "only (a restart compiles again)",
        "مجلد ذاكرة الترجمة {folder} غير قابل للكتابة ({problem})؛ فتُحفظ البرامج المترجَمة في {temp} "
        "لهذا التشغيل وحده (وإعادة التشغيل تترجمها من جديد)"),
    # what runs where (runtime.Backend.banner, model_id)
    "backend_demo_model_id": ("demo {family} (tiny, random weights)", "{family} تجريبي (مصغّر، بأوزان عشوائية)"),
    "backend_banner_part": ("{engine}: {model} on {placement}", "{engine}: {model} على {placement}"),
    "backend_banner_demo": ("demo models with random weights: output is noise",
                            "نماذج تجريبية بأوزان عشوائية: مخرجاتها ضجيج"),
    "backend_banner_fell": ("{engine} FELL BACK to its demo model (random weights): {reason}",
                            "{engine} تراجع إلى نموذجه التجريبي (أوزان عشوائية): {reason}"),
    # --models: why these models (settings.py)
    "backend_models_tiny": ("asked for the demo models (--models tiny)", "طُلبت النماذج التجريبية (--models tiny)"),
    "backend_models_full": ("asked for the real models (--models full)", "طُلبت النماذج الحقيقية (--models full)"),
    "backend_models_auto_tiny": ("--models auto: {why}; using the offline demo models with random weights",
                                 "--models auto: {why}؛ تُستخدم النماذج التجريبية المحلية بأوزان عشوائية"),
    "backend_models_auto_full": ("--models auto: the real model weights are available",
                                 "--models auto: أوزان النماذج الحقيقية متاحة"),
    # warm-up tasks (runtime._plan, warmup.WarmupRunner, cache/warm_start.py)
    "backend_task_weights": ("{engine} · obtain weights", "{engine} · جلب الأوزان"),
    "backend_task_load": ("{engine} · load on {device}", "{engine} · التحميل على {device}"),
    "backend_task_shape": ("{engine} · {title}", "{engine} · {title}"),
    "backend_title_bucket": ("prompt bucket {bucket} tokens", "دلو الموجّه {bucket} رمزًا"),
    "backend_title_batch": ("{title} × batch {batch}", "{title} × دفعة {batch}"),
    "backend_title_chunk": ("{title} in {n} compiled chunk of {chunk}", "{title} في {n} جزء مترجَم من {chunk}"),
    "backend_title_chunks": ("{title} in {n} compiled chunks of {chunk}", "{title} في {n} أجزاء مترجَمة من {chunk}"),
    "backend_title_decode": ("{title} + decode graphs", "{title} + مخططات فك الترميز"),
    "backend_title_size": ("size {size}", "المقاس {size}"),
    "backend_skipped": ("{engine} engine unavailable: {kind} failed ({error})",
                        "محرك {engine} غير متاح: فشل {kind} ({error})"),
    "backend_detail_demo_instead": ("demo model instead: {reason}", "النموذج التجريبي بدلًا منه: {reason}"),
    "backend_detail_eager": ("eager fallback: {why}", "تنفيذ فوري بدلًا من المترجَم: {why}"),
    "backend_download_progress": ("{done} / {total} GB · {rate} MB/s · {files} file(s)",
                                  "{done} / {total} GB · {rate} MB/s · {files} ملف"),
    # an operator action refused (the annex's compile-cache Export button shows it as a toast)
    "err_operator_only": (
        "Exporting the compile cache is an operator action: start the app with --auth and log in.",
        "تصدير ذاكرة الترجمة إجراء للمشغّل: شغّل التطبيق مع ‎--auth وسجّل الدخول."),
    # memory before loading the image model (memory.py)
    "backend_mem_needs": (
        "needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} {decode} GiB "
        "+ activations and overhead {rest} GiB)",
        "يحتاج ~{total} GiB بدقة {dtype} ({params} B من المعاملات: الأوزان {weights} GiB "
        "+ فك الترميز {size} {decode} GiB + التنشيطات والأعباء الإضافية {rest} GiB)"),
    "backend_mem_free": ("{free} GiB free on {kind}", "{free} GiB متاحة على {kind}"),
    "backend_mem_unknown": ("{needs}; free memory on {kind} unknown, not checked",
                            "{needs}؛ الذاكرة المتاحة على {kind} غير معروفة، فلم تُفحص"),
    "backend_mem_fits": ("{needs}; {where}", "{needs}؛ {where}"),
    "backend_mem_half": ("{needs}, more than the {where}: loading in bfloat16 instead, which {half}",
                         "{needs}، أي أكثر من {where}: يُحمَّل بدقة bfloat16 بدلًا من ذلك، وهو {half}"),
    "err_mem_advice": ("--no-image, or smaller --sizes", "--no-image، أو --sizes أصغر"),
    "err_mem_advice_bf16": ("--dtype bfloat16 (which {half}), {advice}", "--dtype bfloat16 (وهو {half})، {advice}"),
    "err_mem_too_big": ("The image model {needs}, more than the {where}. Pass {advice}; or free memory and restart.",
                        "نموذج الصور {needs}، أي أكثر من {where}. مرِّر {advice}؛ أو حرِّر الذاكرة وأعد التشغيل."),
    # the compile counter the alarm shows (compile_counters.SOURCES)
    "backend_counter_neuron_metrics": (
        "TorchNeuron metrics: NEFFs compiled or read from the NEFF cache (eager ops and graphs)",
        "مقاييس TorchNeuron: ملفات NEFF المترجَمة أو المقروءة من ذاكرة NEFF المؤقتة (العمليات الفورية والمخططات)"),
    "backend_counter_neuron_graphs": (
        "TorchNeuron compiled graphs (torch.compile only; eager per-op compiles are not counted: metrics unavailable)",
        "مخططات TorchNeuron المترجَمة (torch.compile وحده؛ لا تُعَدّ ترجمات العمليات الفورية: المقاييس غير متاحة)"),
    "backend_counter_dynamo": ("dynamo graphs and inductor's cache (CPU/CUDA stand-in for Neuron compiles)",
                               "مخططات dynamo وذاكرة inductor المؤقتة (بديل CPU/CUDA عن ترجمات Neuron)"),
    # requests refused by an engine (runtime.Backend.engine, engine.ShapeRegistry)
    "err_engine_disabled": ("The {engine} engine is disabled on this server ({flag}).",
                            "محرك {engine} معطَّل على هذا الخادم ({flag})."),
    "err_engine_failed": ("The {engine} engine failed to load: {error}", "فشل تحميل محرك {engine}: {error}"),
    "err_engine_loading": ("The {engine} engine is still loading{when}; try again shortly.",
                           "ما زال محرك {engine} قيد التحميل{when}؛ حاول مجددًا بعد قليل."),
    "err_engine_loading_eta": (" (expected in about {eta} s)", " (متوقَّع خلال نحو {eta} ث)"),
    "err_shape_failed": ("{engine} shape {label} is unavailable: its warm-up failed ({reason}).",
                         "شكل {engine} ‏{label} غير متاح: فشل إحماؤه ({reason})."),
    "err_shape_warming": ("{engine} shape {label} is still warming up (compiling); try again soon.",
                          "شكل {engine} ‏{label} ما زال قيد الإحماء (الترجمة)؛ حاول مجددًا قريبًا."),
    "err_shape_eta": ("{error} It should be ready in about {eta} s.", "{error} يُتوقَّع أن يجهز خلال نحو {eta} ث."),
}

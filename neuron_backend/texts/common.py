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
    "backend_task_bundle": ("compile cache · install bundle", "ذاكرة الترجمة المؤقتة · تثبيت الحزمة"),
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
    # the compile-cache bundle (cache/bundle.py; the Export button shows it as a toast)
    "err_bundle_no_manifest": (
        "{folder} has no {manifest}: start the app once with the settings the bundle is for and let warm-up finish "
        "(it writes the manifest), then export.",
        "لا يحوي {folder} الملف {manifest}: شغّل التطبيق مرة بالإعدادات التي تُعَدّ الحزمة لها ودع الإحماء يكتمل "
        "(فهو يكتب ملف الوصف)، ثم صدِّر."),
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

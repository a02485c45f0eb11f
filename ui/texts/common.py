"""The tabs, the header and the warm-up status panel: key -> (English, Arabic). English strings are
the page's words exactly (tests find elements by them); {name} fields are filled by ``ui.i18n.say``."""

WORDS: dict[str, tuple[str, str]] = {
    "tab_chat": ("Chat", "المحادثة"),
    "tab_image": ("Image", "الصورة"),
    "tab_qa": ("QA bench", "منصة ضمان الجودة"),
    "header_title": ("Hugging Face models on AWS Trainium", "نماذج Hugging Face على AWS Trainium"),
    "header_summary": (
        "Chat with Qwen3-0.6B and draw with FLUX.2-klein-4B, run natively on Trainium through PyTorch's "
        "neuron device: every shape is compiled once at start, so after warm-up no request waits for a compile.",
        "حاور Qwen3-0.6B وارسم بـ FLUX.2-klein-4B، وكلاهما يعمل أصلًا على Trainium عبر جهاز neuron في PyTorch: "
        "يُترجَم كل شكل مرة واحدة عند البدء، فلا ينتظر أي طلب ترجمةً بعد الإحماء."),
    "status_details": ("Warm-up details", "تفاصيل الإحماء"),
    "status_export_bundle": ("Export compile cache (bundle for another host)",
                             "تصدير ذاكرة الترجمة المؤقتة (حزمة لخادم آخر)"),
    "status_bundle_file": ("Compile-cache bundle (.tar.gz; start another host with --cache-bundle and "
                           "--cache-bundle-sha256, its sha256: python -m tools.cache show prints it)",
                           "حزمة ذاكرة الترجمة (‎.tar.gz؛ شغّل بها خادمًا آخر مع ‎--cache-bundle و‎--cache-bundle-sha256 "
                           "وبصمتها sha256 التي يطبعها `python -m tools.cache show`)"),
    "status_export_operator_only": (
        "Exporting the compile cache is an operator action: it is offered to a logged-in user when the app runs "
        "with `--auth`. On the server: `python -m tools.cache export OUT.tar.gz`.",
        "تصدير ذاكرة الترجمة إجراء للمشغّل: يُتاح لمستخدم مسجّل الدخول حين يعمل التطبيق مع ‎`--auth`. "
        "وعلى الخادم: ‎`python -m tools.cache export OUT.tar.gz`."),
    # header chips and the demo notice (ui/header.py)
    "status_engine_chat": ("Chat", "المحادثة"),
    "status_engine_image": ("Image", "الصورة"),
    "status_chip_ready": ("ready", "جاهز"),
    "status_chip_warming_up": ("warming up", "قيد الإحماء"),
    "status_chip_loading": ("loading", "قيد التحميل"),
    "status_chip_failed": ("failed", "فشل"),
    "status_demo_short": ("demo {family} (tiny)", "{family} تجريبي (مصغّر)"),
    "status_demo_notice": (
        "<b>Demo models: replies and images are noise.</b> This server runs tiny stand-ins with random weights, "
        "built offline (why: {why}). Shapes, timings and code paths are the real ones; with the real weights "
        "cached, <code>--models full</code> gives real output.",
        "<b>نماذج تجريبية: الردود والصور ضجيج.</b> يشغّل هذا الخادم بدائل مصغّرة بأوزان عشوائية بُنيت دون اتصال "
        "(السبب: {why}). أما الأشكال والتوقيتات ومسارات الشيفرة فهي الحقيقية؛ ومع وجود الأوزان الحقيقية في "
        "الذاكرة المؤقتة يعطي <code>--models full</code> مخرجات حقيقية."),
    # the warm-up bar (ui/status_text.py)
    "status_seconds": ("{n} s", "{n} ث"),
    "status_minutes": ("{m} min {s} s", "{m} د {s} ث"),
    "status_done": ("Warm-up done in {elapsed}", "اكتمل الإحماء في {elapsed}"),
    "status_done_failed": (" · {n} failed", " · فشل {n}"),
    "status_warming": ("Warming up: {task} · {done}/{total} tasks", "جارٍ الإحماء: {task} · {done}/{total} مهام"),
    "status_eta": (" · about {eta} left", " · يتبقى نحو {eta}"),
    "status_eta_unknown": (" · ETA learned after the first start", " · يُعرَف الوقت المتبقي بعد أول تشغيل"),
    "status_starting": ("starting", "البدء"),
    "status_recompiles": ("⚠ {n} graph compile(s) after warm-up", "⚠ {n} ترجمة مخططات بعد الإحماء"),
    "status_no_recompiles": ("no recompiles", "لا إعادة ترجمة"),
    "status_fallback": ("⚠ {engine}: the real model failed, so its demo model (random weights) runs instead: {reason}",
                        "⚠ {engine}: فشل النموذج الحقيقي، فيعمل نموذجه التجريبي (أوزان عشوائية) بدلًا منه: {reason}"),
    # the task table
    "status_col_task": ("task", "المهمة"),
    "status_col_shape": ("shape", "الشكل"),
    "status_col_state": ("state", "الحالة"),
    "status_col_seconds": ("seconds", "الثواني"),
    "status_col_cache": ("compile cache", "ذاكرة الترجمة"),
    "status_col_error": ("error", "الخطأ"),
    "status_state_queued": ("queued", "في الانتظار"),
    "status_state_running": ("running", "قيد التنفيذ"),
    "status_state_ready": ("ready", "جاهز"),
    "status_state_failed": ("failed", "فشل"),
    "status_state_skipped": ("skipped", "تُخطّي"),
    "status_hit": ("hit", "إصابة"),
    "status_miss": ("miss", "إخفاق"),
    "status_hit_bundle": ("{hit} (bundle)", "{hit} (من الحزمة)"),
    "status_from_bundle": ("from bundle", "من الحزمة"),
    "status_expected": (" (expected {eta})", " (المتوقَّع {eta})"),
    # the details (ui/status_panel.py, counters_lines)
    "status_runs_on": ("**Runs on:** {banner}", "**يعمل على:** {banner}"),
    "status_models": ("**Models:** {reason}", "**النماذج:** {reason}"),
    "status_device": ("**Device:** {device}", "**الجهاز:** {device}"),
    "status_engine_line": ("**{engine} engine:** {state}", "**محرك {engine}:** {state}"),
    "status_engine_disabled": ("disabled", "معطَّل"),
    "status_cache_line": ("**Compile cache:** {folder}", "**ذاكرة الترجمة المؤقتة:** {folder}"),
    "status_compiles_line": ("**Graph compiles after warm-up:** {n}", "**ترجمات المخططات بعد الإحماء:** {n}"),
    "status_software": ("**Software:** {versions}", "**البرمجيات:** {versions}"),
    "status_counter_line": ("**Compile counter shown:** {counter}", "**عدّاد الترجمة المعروض:** {counter}"),
    "status_memory_unavailable": ("**Memory {device}:** unavailable ({error})",
                                  "**ذاكرة {device}:** غير متاحة ({error})"),
    "status_memory": ("**Memory {device}:** {used} GiB allocated of {total} GiB",
                      "**ذاكرة {device}:** ‏{used} GiB محجوزة من {total} GiB"),
    "status_cpu_ops": ("**Ops that fell back to CPU:** {ops}", "**العمليات التي رجعت إلى CPU:** {ops}"),
    "status_none": ("none", "لا شيء"),
    # the size picker (size_choice_label)
    "status_size_ready": ("ready", "جاهز"),
    "status_size_failed": ("failed", "فشل"),
    "status_size_unavailable": ("unavailable", "غير متاح"),
    "status_size_compiling": ("compiling", "قيد الترجمة"),
    "status_size_queued": ("queued", "في الانتظار"),
    "status_size_eta": ("{state}, ~{eta}", "{state}، ~{eta}"),
    # toast titles (Gradio writes them in English; ui/i18n.py's CSS shows these in Arabic)
    "toast_title_error": ("Error", "خطأ"),
    "toast_title_warning": ("Warning", "تنبيه"),
    "toast_title_info": ("Info", "معلومة"),
    "toast_title_success": ("Success", "تمّ"),
}

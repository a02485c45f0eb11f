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
    "status_bundle_file": ("Compile-cache bundle (.tar.gz; start another host with --cache-bundle)",
                           "حزمة ذاكرة الترجمة (‎.tar.gz؛ شغّل بها خادمًا آخر مع ‎--cache-bundle)"),
}

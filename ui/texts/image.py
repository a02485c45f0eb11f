"""The Image tab: key -> (English, Arabic). English strings are the page's words exactly
(tests find elements by them); {name} fields are filled by ``ui.i18n.say``."""

WORDS: dict[str, tuple[str, str]] = {
    "image_prompt": ("Prompt", "الموجّه"),
    "image_size": ("Size (precompiled only)", "المقاس (المُترجَمة مسبقًا فقط)"),
    "image_steps": ("Steps", "الخطوات"),
    "image_count": ("Images per run", "عدد الصور في كل تشغيل"),
    "image_count_info": ("consecutive seeds, made one after another", "بذور متتالية، تُصنع الواحدة تلو الأخرى"),
    "image_seed": ("Seed", "البذرة"),
    "image_randomize": ("Randomize seed", "بذرة عشوائية"),
    "image_reuse_seed": ("Reuse last seed", "إعادة استخدام آخر بذرة"),
    "image_guidance": ("Guidance", "قوة التوجيه"),
    "image_live_preview": ("Live preview", "معاينة حية"),
    "image_preview_off": ("off on this server (--no-image-preview)", "معطّلة على هذا الخادم (‎--no-image-preview)"),
    "image_generate": ("Generate", "توليد"),
    "image_stop": ("Stop", "إيقاف"),
    "image_restore": ("Restore settings from a PNG", "استعادة الإعدادات من ملف PNG"),
    "image_drop_png": ("Drop a PNG (this app's or A1111-style) to fill the form",
                       "أفلت ملف PNG (من هذا التطبيق أو بنمط A1111) لملء النموذج"),
    "image_examples": ("Examples", "أمثلة"),
    "image_out": ("Image", "الصورة"),
    "image_png_file": ("PNG with embedded parameters", "ملف PNG مع المعاملات المضمّنة"),
    "image_params": ("Parameters", "المعاملات"),
    "image_snippet": ("Use from Python", "الاستخدام من Python"),
    "image_gallery": ("This session's images (click one for its PNG and parameters)",
                      "صور هذه الجلسة (انقر صورة لعرض ملف PNG ومعاملاتها)"),
}

"""The Chat tab: key -> (English, Arabic). English strings are the page's words exactly
(tests find elements by them); {name} fields are filled by ``ui.i18n.say``."""

WORDS: dict[str, tuple[str, str]] = {
    "chat_system_prompt": ("System prompt", "موجّه النظام"),
    "chat_system_placeholder": ("You are a helpful assistant.", "أنت مساعد مفيد."),
    "chat_thinking": ("Thinking (show the model's reasoning)", "التفكير (عرض استدلال النموذج)"),
    "chat_temperature": ("Temperature", "درجة الحرارة"),
    "chat_top_p": ("top_p", "top_p"),
    "chat_top_k": ("top_k", "top_k"),
    "chat_max_new_tokens": ("Max new tokens", "الحد الأقصى للرموز الجديدة"),
    "chat_greedy": ("Greedy (no sampling)", "جشع (دون أخذ عينات)"),
    "chat_seed": ("Seed (-1 = random)", "البذرة (‎-1 = عشوائية)"),
    "chat_chatbot": ("Qwen3", "Qwen3"),
    "chat_settings": ("Sampling and system prompt", "أخذ العينات وموجّه النظام"),
    "chat_examples": ("Examples", "أمثلة"),
    "chat_demo_thinking": (
        "The demo model never reasons (its vocabulary leaves out the <think> tags), so no reasoning shows "
        "here; the toggle still switches to Qwen's thinking sampling defaults.",
        "النموذج التجريبي لا يستدل أبدًا (مفرداته تخلو من وسوم <think>)، فلا يظهر هنا أي استدلال؛ "
        "ومع ذلك يبدّل المفتاح إلى إعدادات أخذ العينات الافتراضية لوضع التفكير في Qwen."),
    "chat_export_json": ("Export JSON", "تصدير JSON"),
    "chat_export_md": ("Export Markdown", "تصدير Markdown"),
    "chat_load_json": ("Load JSON", "تحميل JSON"),
    "chat_export_file": ("Conversation export", "ملف المحادثة المُصدَّر"),
    "chat_feedback_comment": ("Comment on your mark (optional)", "تعليق على تقييمك (اختياري)"),
    "chat_feedback_save": ("Save comment", "حفظ التعليق"),
}

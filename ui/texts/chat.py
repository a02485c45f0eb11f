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
    # ----- built at run time (ui/presentation.py, chat_view.py, chat_saved.py, chat_export.py) -----------
    # the stats line under a reply: "0.12 s to first token · 35.1 tokens/s · 40 new tokens · seed 7 · no compile"
    "chat_stats_line": ("{first} s to first token · {speed} tokens/s · {new} new tokens",
                        "{first} ث حتى أول رمز · {speed} رمز/ث · رموز جديدة: {new}"),
    "chat_stats_seed": (" · seed {seed}", " · البذرة {seed}"),
    "chat_stats_compiled": ("⚠ compiled a graph", "⚠ تُرجِم رسم حسابي (graph)"),
    "chat_stats_no_compile": ("no compile", "بلا ترجمة"),
    "chat_stats_stopped": (" · stopped", " · أُوقِف"),
    "chat_stats_cut": (" · cut at the {limit}-token limit", " · قُطِع عند حدّ {limit} رمزًا"),
    "chat_meter_idle": ("Context: prompt buckets {buckets} tokens · cache {context} tokens",
                        "السياق: حاويات الموجّه {buckets} رمزًا · الذاكرة المؤقتة {context} رمزًا"),
    "chat_meter": ("Context: prompt {prompt}/{bucket} tokens (bucket) · {used}/{context} tokens of cache",
                   "السياق: الموجّه {prompt}/{bucket} رمزًا (الحاوية) · {used}/{context} رمزًا من الذاكرة المؤقتة"),
    "chat_meter_dropped": (" · ⚠ {dropped} oldest turn(s) dropped to fit the {limit}-token limit",
                           " · ⚠ أُسقِط أقدم الأدوار (عددها {dropped}) ليتسع الموجّه لحدّ {limit} رمزًا"),
    "chat_refused_title": ("⚠ Not answered", "⚠ بلا إجابة"),
    "chat_feedback_thanks": ("Thanks: reply marked {mark}. Add a comment below if you like.",
                             "شكرًا: قُيِّم الرد بـ {mark}. أضف تعليقًا أدناه إن شئت."),
    "chat_feedback_saved": ("Comment saved.", "حُفِظ التعليق."),
}

"""The page's words in English and Arabic: one table, Gradio's ``gr.I18n``, and the right-to-left glue.

``STRINGS`` maps a key to (English, Arabic). Components take ``label=t("key")``; Gradio sends the key
and the frontend (svelte-i18n) shows the text of the visitor's locale, which it takes from
``navigator.language`` (an ``ar-*`` browser gets Arabic, any other English); the footer's Settings
menu switches it. ``HEAD`` adds ``?lang=ar|en`` as an override and keeps ``<html dir>`` in step with
the locale (svelte-i18n writes ``<html lang>``; Gradio never sets ``dir``). ``CSS`` makes Arabic text
in messages, prompts and the QA grid read right to left in either UI language.

What stays English: text built at run time in Python (header chips and warm-up bar, stats lines,
details, messages and errors from the backend), Dataframe headers, radio/dropdown values, the example
prompts (they are what is sent). README, "Languages", lists them.
"""

from __future__ import annotations

import html

import gradio as gr

# key -> (English, Arabic). English strings are the page's words exactly (tests find elements by them).
STRINGS: dict[str, tuple[str, str]] = {
    # tabs and header
    "tab_chat": ("Chat", "المحادثة"),
    "tab_image": ("Image", "الصورة"),
    "tab_qa": ("QA bench", "منصة ضمان الجودة"),
    "header_title": ("Hugging Face models on AWS Trainium", "نماذج Hugging Face على AWS Trainium"),
    "header_summary": (
        "Chat with Qwen3-0.6B and draw with FLUX.2-klein-4B, run natively on Trainium through PyTorch's "
        "neuron device: every shape is compiled once at start, so after warm-up no request waits for a compile.",
        "حاور Qwen3-0.6B وارسم بـ FLUX.2-klein-4B، وكلاهما يعمل أصلًا على Trainium عبر جهاز neuron في PyTorch: "
        "يُترجَم كل شكل مرة واحدة عند البدء، فلا ينتظر أي طلب ترجمةً بعد الإحماء."),
    # status panel
    "status_details": ("Warm-up details", "تفاصيل الإحماء"),
    "status_export_bundle": ("Export compile cache (bundle for another host)",
                             "تصدير ذاكرة الترجمة المؤقتة (حزمة لخادم آخر)"),
    "status_bundle_file": ("Compile-cache bundle (.tar.gz; start another host with --cache-bundle)",
                           "حزمة ذاكرة الترجمة (‎.tar.gz؛ شغّل بها خادمًا آخر مع ‎--cache-bundle)"),
    # chat tab
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
    # image tab
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
    # QA bench tab
    "qa_prompts": ("Prompts (one per line)", "الموجّهات (موجّه في كل سطر)"),
    "qa_upload": ("…or a .jsonl / .csv / .txt file with a 'prompt' column (and expectations)",
                  "…أو ملف ‎.jsonl / .csv / .txt فيه عمود 'prompt' (والنتائج المتوقعة)"),
    "qa_engine": ("Engine", "المحرّك"),
    "qa_variants": ("Variants (name: key=value, …; one per line, or JSON)",
                    "المتغيّرات (الاسم: key=value، …؛ متغيّر في كل سطر، أو JSON)"),
    "qa_run_seed": ("Run seed (fixes every cell's seed)", "بذرة التشغيل (تثبّت بذرة كل خلية)"),
    "qa_run": ("Run set", "تشغيل المجموعة"),
    "qa_stop": ("Stop", "إيقاف"),
    "qa_status": ("Status", "الحالة"),
    "qa_summary": ("Summary per variant (passed / failed: the reviewer's mark, else the automatic verdict)",
                   "ملخص لكل متغيّر (نجح / فشل: تقييم المراجع، وإلا فالحكم الآلي)"),
    "qa_grid": ("Results (prompt × variant): click a cell to review it",
                "النتائج (موجّه × متغيّر): انقر خلية لمراجعتها"),
    "qa_images": ("Images", "الصور"),
    "qa_cell": ("Cell # (click the grid; 0 = none)", "رقم الخلية (انقر الجدول؛ 0 = لا شيء)"),
    "qa_mark": ("Mark", "التقييم"),
    "qa_comment": ("Comment", "تعليق"),
    "qa_save_mark": ("Save mark", "حفظ التقييم"),
    "qa_rerun": ("Re-run cell", "إعادة تشغيل الخلية"),
    "qa_speed": ("Speed and cost per cell (sort from a column's ⋮ menu)",
                 "السرعة والتكلفة لكل خلية (رتّب من قائمة ⋮ في العمود)"),
    "qa_ab": ("Blind A/B: two variants, names hidden, sides shuffled",
              "مقارنة A/B عمياء: متغيّران، الأسماء مخفية والجانبان مخلوطان"),
    "qa_ab_first": ("Variant", "المتغيّر"),
    "qa_ab_second": ("against", "مقابل"),
    "qa_ab_start": ("Start blind review", "بدء المراجعة العمياء"),
    "qa_ab_pair": ("Pair", "الزوج"),
    "qa_left": ("Left", "اليسار"),
    "qa_right": ("Right", "اليمين"),
    "qa_pick_left": ("Left is better", "اليسار أفضل"),
    "qa_pick_tie": ("Tie", "تعادل"),
    "qa_pick_right": ("Right is better", "اليمين أفضل"),
    "qa_reveal": ("End and reveal", "إنهاء وكشف الأسماء"),
    "qa_result": ("Result", "النتيجة"),
    "qa_export_html": ("Export HTML report", "تصدير تقرير HTML"),
    "qa_export_jsonl": ("Export JSONL", "تصدير JSONL"),
    "qa_export_csv": ("Export CSV", "تصدير CSV"),
    "qa_import": ("Import a JSONL run", "استيراد تشغيل JSONL"),
    "qa_compare": ("Run it again and compare", "أعد التشغيل وقارن"),
    "qa_export_file": ("Export", "الملف المُصدَّر"),
    "qa_only_changed": ("Show only what changed", "اعرض ما تغيّر فقط"),
    "qa_compare_grid": ("What changed (after 'Run it again and compare')",
                        "ما الذي تغيّر (بعد 'أعد التشغيل وقارن')"),
    "qa_diff": ("Text diffs of the changed chat cells (- old, + new)",
                "فروق نصوص خلايا المحادثة المتغيّرة (- القديم، + الجديد)"),
    "qa_diff_gallery": ("Changed images: old left, new right", "الصور المتغيّرة: القديمة يسارًا، والجديدة يمينًا"),
    "qa_mark_pass": ("pass", "نجح"),
    "qa_mark_fail": ("fail", "فشل"),
    "qa_mark_unmarked": ("unmarked", "بلا تقييم"),
}

# Gradio's own strings that its Arabic table (templates/frontend/assets/ar-*.js) lacks; English is Gradio's.
GRADIO_STRINGS: dict[str, tuple[str, str]] = {
    "chat_interface.new_chat": ("New chat", "محادثة جديدة"),
    "chat_interface.message_placeholder": ("Type a message...", "اكتب رسالة..."),
    "chat_interface.additional_inputs": ("Additional inputs", "مدخلات إضافية"),
    "chat_interface.chatbot": ("Chatbot", "روبوت المحادثة"),
    "chat_interface.conversation": ("Conversation", "محادثة"),
}

I18N = gr.I18n(en={k: en for k, (en, _) in STRINGS.items()},
               ar={k: ar for k, (_, ar) in {**STRINGS, **GRADIO_STRINGS}.items()})


def t(key: str) -> gr.i18n.I18nData:
    """The translatable text of ``key`` for a component's label, info, placeholder or value."""
    if key not in STRINGS:
        raise KeyError(f"no string {key!r} in ui/i18n.py STRINGS")
    return I18N(key)


def english(key: str) -> str:
    return STRINGS[key][0]


def bilingual_html(key: str) -> str:
    """Both texts of ``key`` for HTML built in Python (no I18n there): CSS shows the one of ``<html lang>``."""
    en, ar = (html.escape(s, quote=False) for s in STRINGS[key])
    return f'<span class="i18n-en">{en}</span><span class="i18n-ar" lang="ar">{ar}</span>'


# ?lang=ar|en: redefine navigator.language/languages before Gradio's module script reads them (its
# svelte-i18n picks the locale from them once, at start). launch(head=) comes too late for that: Gradio adds
# it to the page only after the config is fetched and the locale chosen; so LanguageOverride puts this
# script at the top of the page's <head> when the address asks for a language.
EARLY_SCRIPT = """<script>
(() => {
  const wanted = (new URLSearchParams(location.search).get("lang") || "").toLowerCase();
  if (!["ar", "en"].includes(wanted)) return;
  for (const [name, value] of [["language", wanted], ["languages", [wanted]]]) {
    try { Object.defineProperty(navigator, name, {get: () => value, configurable: true}); } catch (e) {}
  }
})();
</script>"""

# <html dir> follows <html lang>, which svelte-i18n writes for the chosen locale (at start, and when
# the footer's Settings menu changes the language): rtl for Arabic, ltr otherwise.
HEAD = """<script>
(() => {
  const root = document.documentElement;
  const follow = () => {
    const arabic = (root.getAttribute("lang") || "").toLowerCase().startsWith("ar");
    root.setAttribute("dir", arabic ? "rtl" : "ltr");
  };
  new MutationObserver(follow).observe(root, {attributes: true, attributeFilter: ["lang"]});
  follow();
})();
</script>"""


class LanguageOverride:
    """ASGI middleware: on a GET whose query has ``lang=``, puts ``EARLY_SCRIPT`` first in an HTML page's <head>.

    Only HTML responses are touched (their body is buffered, then Content-Length is set anew);
    everything else passes through as it is.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or b"lang=" not in scope.get("query_string", b""):
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        chunks: list[bytes] = []

        async def rewrite(message):
            nonlocal start
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                if content_type.startswith(b"text/html"):
                    start = message
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = b"".join(chunks).replace(b"<head>", b"<head>" + EARLY_SCRIPT.encode(), 1)
                headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, rewrite)


# Arabic text reads right to left in either UI language: each paragraph of a message, a textbox or a
# grid cell takes its direction from its first strong letter (unicode-bidi: plaintext) and starts on
# that side (text-align: start). In Arabic the whole page is dir="rtl" (HEAD), so rows and labels flip.
CSS = """
#chatbot .message-content, #chatbot .message .prose, #chatbot .message p, #chatbot .message li,
textarea, input[type="text"], input:not([type]), [role="gridcell"], td, .cell-wrap, .cell-wrap .text,
.example-text-content, .prose p {
  unicode-bidi: plaintext;
  text-align: start;
}
#page-header h1, #page-header .summary, #page-header .demo-notice { unicode-bidi: plaintext; text-align: start; }
html:not([lang^="ar"]) .i18n-ar, html[lang^="ar"] .i18n-en { display: none; }
/* Gradio writes dir="ltr" on every block (its per-component rtl= flag, off here): in Arabic they follow the page */
html[dir="rtl"] .block[dir="ltr"] { direction: rtl; }
html[dir="rtl"] label > input[type="radio"], html[dir="rtl"] label > input[type="checkbox"] {
  margin-right: 0; margin-left: var(--size-2, 8px);
}
/* code, JSON and the like stay left to right in either language */
html[dir="rtl"] .cm-editor, html[dir="rtl"] pre, html[dir="rtl"] .json-holder { direction: ltr; text-align: left; }
"""

"""What the page needs to pass axe-core with zero critical and zero serious findings: theme colours at
4.5:1 or better (``THEME``, ``CSS``), whole fonts (``FONT``), and repairs of Gradio's own markup as it
renders (``HEAD``). Each repair and the axe rule it answers: docs/page.md, "Accessibility".
"""

from __future__ import annotations

import json

import gradio as gr

# Declared at 400 and 700 (complete files): Gradio 6.31's semibold (600) files are subsets of a few dozen glyphs.
FONT = [gr.themes.LocalFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif", "system-ui", "sans-serif"]
# The fonts the first view draws, asked for with the page (a late font re-wrapped the title). Relative URLs, as in
# theme.css.
FONT_PRELOAD = "".join(f'<link rel="preload" href="static/fonts/{face}.woff2" as="font" type="font/woff2" crossorigin>'
                       for face in ("SourceSansPro/SourceSansPro-Regular", "SourceSansPro/SourceSansPro-Bold",
                                    "IBMPlexMono/IBMPlexMono-Regular"))
FONT_MONO = [gr.themes.LocalFont("IBM Plex Mono", weights=(400, 700)), "ui-monospace", "Consolas", "monospace"]
THEME = gr.themes.Default(font=FONT, font_mono=FONT_MONO).set(
    button_primary_background_fill="*primary_700",
    button_primary_background_fill_dark="*primary_700",
    button_primary_background_fill_hover="*primary_800",
    button_primary_background_fill_hover_dark="*primary_800",
    button_cancel_background_fill="#b91c1c",
    button_cancel_background_fill_dark="#b91c1c",
    button_cancel_background_fill_hover="#991b1b",
    button_cancel_background_fill_hover_dark="#991b1b",
    body_text_color_subdued="*neutral_600",
)

# A click on the disabled arrow goes to the fold title under it, and the arrow keeps its look. The JSON
# viewer (the image's parameters) keeps its dark-theme syntax colours in dark mode; on white they read at
# 2.0-3.9:1, so the light theme gets darker ones of the same hues (5.5-7.7:1).
CSS = """
[role="button"] button[disabled][aria-hidden="true"] { pointer-events: none; opacity: 1; cursor: pointer; }
body:not(.dark) .tab-container button[role="tab"].selected { color: var(--primary-700); }
body:not(.dark) .gradio-container .json-node {
  --text-color: #9a3412; --string-color: #b4441f; --number-color: #1e5a6b; --bracket-color: #3f6464;
  --square-bracket-color: #a8323c; --punctuation-color: #47615f;
}
"""

# Gradio 6.31's aria-labels, English in every locale: whole labels, and labels that start with English words
# before a component's own (translated) label or an example's text.
GRADIO_ARIA_LABELS = {
    "Empty value": "لا قيمة",
    "Reset to default value": "إعادة إلى القيمة الافتراضية",
    "chatbot conversation": "محادثة روبوت المحادثة",
    "Copy table data": "نسخ بيانات الجدول",
    "Fullscreen": "ملء الشاشة",
    "Exit fullscreen": "الخروج من ملء الشاشة",
    "Table actions": "إجراءات الجدول",
    "Click to upload or drop files": "انقر للرفع أو أفلت الملفات",
    "More tabs": "مزيد من التبويبات",
    "Gradio footer navigation": "تنقّل تذييل Gradio",
    "Image": "صورة",
    "Clear": "مسح",
    "Download": "تنزيل",
    "Share": "مشاركة",
    "Copy": "نسخ",
    "Copy message": "نسخ الرسالة",
    "Copy conversation": "نسخ المحادثة",
    "Clear conversation": "مسح المحادثة",
    "Retry": "إعادة المحاولة",
    "Undo": "تراجع",
    "Edit": "تحرير",
    "Like": "إعجاب",
    "Dislike": "عدم إعجاب",
    "Remove": "إزالة",
    "Stop": "إيقاف",
    "Submit": "إرسال",
}
GRADIO_ARIA_PREFIXES = {
    "number input for ": "حقل رقمي لـ ",
    "range slider for ": "منزلق نطاق لـ ",
    "Select example ": "اختر المثال ",
}

HEAD = r"""<script>
(() => {
  const ARIA = __ARIA__, ARIA_PREFIXES = Object.entries(__ARIA_PREFIXES__);
  const arabic = () => (document.documentElement.getAttribute("lang") || "").toLowerCase().startsWith("ar");
  const inArabic = (english) => {
    if (ARIA[english]) return ARIA[english];
    for (const [prefix, shown] of ARIA_PREFIXES) {
      if (english.startsWith(prefix)) return shown + english.slice(prefix.length);
    }
    return null;
  };
  const followLanguage = () => {  // Gradio's English aria-labels in the page's language
    if (arabic()) {
      for (const node of document.querySelectorAll("[aria-label]")) {
        const english = node.getAttribute("aria-label"), shown = inArabic(english);
        if (shown) { node.dataset.ariaEnglish = english; node.setAttribute("aria-label", shown); }
      }
    } else {
      for (const node of document.querySelectorAll("[data-aria-english]")) {
        node.setAttribute("aria-label", node.dataset.ariaEnglish);
        delete node.dataset.ariaEnglish;
      }
    }
  };
  const repair = () => {
    for (const box of document.querySelectorAll('.examples[role="list"]')) {
      box.setAttribute("role", "group");
    }
    for (const empty of document.querySelectorAll('div.empty[aria-label]:not([role])')) {
      empty.setAttribute("role", "img");
    }
    for (const message of document.querySelectorAll('[data-testid="bot"][aria-label]:not([role]), '
                                                     + '[data-testid="user"][aria-label]:not([role])')) {
      message.setAttribute("role", "article");
    }
    for (const arrow of document.querySelectorAll('[role="button"] button:not([aria-hidden])')) {
      arrow.disabled = true;  // not focusable (a negative tabindex still is, to assistive technology)
      arrow.setAttribute("aria-hidden", "true");
    }
    for (const picture of document.querySelectorAll('.image-container > button:not([aria-label])')) {
      const label = picture.closest(".block")?.querySelector('[data-testid="block-label"]');
      picture.setAttribute("aria-label", (label && label.textContent.trim()) || "Image");
    }
    for (const zone of document.querySelectorAll('button.upload-container[aria-label]')) {
      zone.removeAttribute("aria-label");  // its own words name it: "Drop File Here - or - Click to Upload"
      delete zone.dataset.ariaEnglish;
    }
    for (const thumb of document.querySelectorAll('button.thumbnail-item[aria-label]')) {
      if (!thumb.querySelector(".caption-label")?.textContent.trim()) continue;
      thumb.removeAttribute("aria-label");  // its caption names it ("seed 7 · 64x64"), not "Thumbnail 1 of 2"
      delete thumb.dataset.ariaEnglish;
      for (const img of thumb.querySelectorAll('img:not([alt=""])')) img.setAttribute("alt", "");  // as the caption
    }
    for (const icon of document.querySelectorAll('footer button > img:not([alt=""])')) {
      icon.setAttribute("alt", "");  // the button's own words name it ("Settings"): the icon is decoration
    }
    followLanguage();
    if (!document.body.classList.contains("dark")) {
      for (const token of document.querySelectorAll(".cm-content span:not([data-contrast])")) {
        token.dataset.contrast = "checked";
        readable(token);
      }
    }
  };
  const luminance = (r, g, b) => {
    const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const readable = (token) => {
    let [r, g, b] = (getComputedStyle(token).color.match(/[\d.]+/g) || []).slice(0, 3).map(Number);
    if (b === undefined) return;
    let steps = 0;
    while (1.05 / (luminance(r, g, b) + 0.05) < 5 && steps++ < 40) { r *= 0.93; g *= 0.93; b *= 0.93; }
    if (steps) token.style.color = `rgb(${Math.round(r)}, ${Math.round(g)}, ${Math.round(b)})`;
  };
  let queued = false;  // one repair per frame, however many nodes a streamed reply changes
  const soon = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; repair(); });
  };
  const start = () => {
    repair();
    // attributes too: Gradio writes a drop zone's or a thumbnail's aria-label again when it redraws it
    new MutationObserver(soon).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                       attributeFilter: ["aria-label", "alt"]});
    new MutationObserver(soon).observe(document.documentElement, {attributes: true, attributeFilter: ["lang"]});
  };
  if (document.body) start(); else document.addEventListener("DOMContentLoaded", start);
})();
</script>""".replace("__ARIA__", json.dumps(GRADIO_ARIA_LABELS)).replace("__ARIA_PREFIXES__",
                                                                   json.dumps(GRADIO_ARIA_PREFIXES))

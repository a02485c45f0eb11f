"""The compile-cache bundles' Arabic, keyed by their English templates; registered into the one catalog."""

from neuron_backend.messages import register

# English template -> Arabic; "context\x04template" where one English word reads two ways (gettext's
# msgctxt): the call passes ctx="context".
ARABIC: dict[str, str] = {
    "--cache-bundle: {path} does not exist (a .tar.gz from python -m tools.cache export, a folder holding one, or hf://owner/repo)": "--cache-bundle: ‏{path} غير موجود (يُنتظر ملف ‎.tar.gz من `python -m tools.cache export`، أو مجلد يحوي واحدًا، أو hf://owner/repo)",
    "--cache-bundle: {path} holds {n} archives; pass one .tar.gz file": "--cache-bundle: في {path} من الأرشيفات {n}؛ مرِّر ملف ‎.tar.gz واحدًا",
    "cannot fetch the bundle {source} from the Hub ({kind}: {error}); download it yourself and pass the file with --cache-bundle PATH": "تعذّر جلب الحزمة {source} من منصة Hub ‏({kind}: {error})؛ نزِّلها بنفسك ومرِّر الملف عبر --cache-bundle PATH",
    "compile cache · install bundle": "ذاكرة الترجمة المؤقتة · تثبيت الحزمة",
    "could not move {rel} into the cache ({error}); the files already moved were put back": "تعذّر نقل {rel} إلى ذاكرة الترجمة ({error})؛ وأُعيدت الملفات التي نُقلت قبله",
    "nothing installed from {name}: {summary}": "لم يُثبَّت شيء من {name}: {summary}",
    "refused {source}: a bundle is code (inductor's cache entries are pickles that run when warm-up looks a graph up); pass --cache-bundle-sha256 <sha256 of the archive>, as python -m tools.cache export printed it where the bundle was made (python -m tools.cache show PATH prints it too)": "رُفضت الحزمة {source}: الحزمة شيفرة تُنفَّذ (مدخلات ذاكرة inductor المؤقتة كائنات pickle تُشغَّل حين يبحث الإحماء عن مخطط)؛ مرِّر --cache-bundle-sha256 مع بصمة sha256 للأرشيف كما طبعها `python -m tools.cache export` حيث صُنعت الحزمة (ويطبعها `python -m tools.cache show PATH` أيضًا)",
    "refused: archive member {name} is a sparse file": "رُفضت الحزمة: العنصر {name} في الأرشيف ملف متناثر (sparse)",
    "refused: archive member {name} is not a regular file": "رُفضت الحزمة: العنصر {name} في الأرشيف ليس ملفًا عاديًا",
    "refused: archive member {name} is outside files/ (paths must stay in the cache)": "رُفضت الحزمة: العنصر {name} في الأرشيف خارج files/ (يجب أن تبقى المسارات داخل ذاكرة الترجمة)",
    "refused: more than {n} files in the archive": "رُفضت الحزمة: في الأرشيف أكثر من {n} ملف",
    "refused: no {manifest} in the archive (not a bundle made by python -m tools.cache export)": "رُفضت الحزمة: لا يوجد {manifest} في الأرشيف (فهو ليس حزمة صنعها `python -m tools.cache export`)",
    "refused: the files add up to more than {limit} bytes": "رُفضت الحزمة: مجموع أحجام الملفات يتجاوز {limit} بايت",
    "refused: the manifest and the archive disagree on {n} files (e.g. {examples})": "رُفضت الحزمة: يختلف ملف الوصف والأرشيف في {n} ملف (مثل {examples})",
    "refused: {manifest} is not a format-{format} bundle manifest": "رُفضت الحزمة: {manifest} ليس ملف وصف حزمة بالصيغة {format}",
    "refused: {manifest} is not valid JSON ({error})": "رُفضت الحزمة: {manifest} ليس JSON صالحًا ({error})",
    "refused: {manifest} is {size} bytes (at most {limit})": "رُفضت الحزمة: حجم {manifest} ‏{size} بايت (والحد الأقصى {limit})",
    "refused: {name} has sha256 {actual}, not the pinned {pinned} (--cache-bundle-sha256); it is not the archive that was pinned, nothing installed": "رُفضت الحزمة: بصمة sha256 للملف {name} هي {actual}، لا البصمة المثبَّتة {pinned} ‏(--cache-bundle-sha256)؛ فهو ليس الأرشيف المقصود، ولم يُثبَّت شيء",
    "refused: {name} is not a readable tar archive ({error})": "رُفضت الحزمة: {name} ليس أرشيف tar مقروءًا ({error})",
    "refused: {name} unpacks to {need} bytes; the cache's disk has {free} bytes free ({margin} must stay free)": "رُفضت الحزمة: يُفك {name} إلى {need} بايت، وعلى قرص ذاكرة الترجمة {free} بايت فارغة (ويجب أن يبقى {margin} بايت فارغًا)",
    "refused: {path} is {size} bytes (at most {limit})": "رُفضت الحزمة: حجم {path} ‏{size} بايت (والحد الأقصى {limit})",
    "refused: {rel} cannot be written in the cache: {path} is a link or not a folder/file as expected; nothing installed": "رُفضت الحزمة: لا يمكن كتابة {rel} في ذاكرة الترجمة: {path} رابط أو ليس مجلدًا/ملفًا كما يُنتظر؛ ولم يُثبَّت شيء",
    "refused: {rel} does not match its sha256 in the manifest (corrupt or tampered)": "رُفضت الحزمة: {rel} لا يطابق بصمة sha256 المسجَّلة له في ملف الوصف (تالف أو عُبث به)",
    "refused: {rel} is {size} bytes, the manifest says {expected}": "رُفضت الحزمة: حجم {rel} ‏{size} بايت، وملف الوصف يقول {expected}",
    "The compile cache packs into more than {limit} bytes, the bound of the exports folder: export it on the server with python -m tools.cache export OUT.tar.gz.": "تتجاوز حزمة ذاكرة الترجمة {limit} بايت، وهو حد مجلد التصدير: صدِّرها على الخادم بالأمر python -m tools.cache export OUT.tar.gz.",
    "{engine} engine: not enabled here ({n} graphs unused)": "محرك {engine}: غير مفعَّل هنا (لن يُستخدم من المخططات {n})",
    "{engine} shapes {shapes}: in the bundle, not declared here": "أشكال {engine} ‏{shapes}: في الحزمة، وغير معلنة هنا",
    "{engine} {field}: {here} here, {theirs} in the bundle": "محرك {engine}، {field}: ‏{here} هنا، و{theirs} في الحزمة",
    "{field} {here} here, {theirs} in the bundle": "{field}: ‏{here} هنا، و{theirs} في الحزمة",
    "{folder} has no {manifest}: start the app once with the settings the bundle is for and let warm-up finish (it writes the manifest), then export.": "لا يحوي {folder} الملف {manifest}: شغّل التطبيق مرة بالإعدادات التي تُعَدّ الحزمة لها ودع الإحماء يكتمل (فهو يكتب ملف الوصف)، ثم صدِّر.",
    "{installed} files installed, {present} already present": "ثُبِّت من الملفات {installed}، وكان {present} موجودًا من قبل",
    "{usable} of {total} graphs usable": "{usable} من {total} مخططات صالحة للاستخدام",
}

register(ARABIC)

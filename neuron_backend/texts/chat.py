"""The chat engine's messages: key -> (English, Arabic); {name} fields
are filled with the message's parameters (``neuron_backend.messages.msg``).

Arabic templates put a message part that is itself a message ({what}, {where}) before a colon, so
no verb has to agree with its gender. Parameter names, flags and values stay as they are.
"""

MESSAGES: dict[str, tuple[str, str]] = {
    # ----- bubbles and notices of a reply (chat/history.py, chat/text.py) ------------------------------
    "chat_reasoning_title": ("💭 Reasoning", "💭 الاستدلال"),
    "chat_notice_stopped_at_limit": ("Stopped at the limit of {limit} new tokens, {where}",
                                     "توقّف عند حدّ {limit} من الرموز الجديدة، {where}"),
    "chat_notice_while_reasoning": ("while still reasoning: no answer yet",
                                    "وهو لا يزال يستدل: لا إجابة بعد"),
    "chat_notice_before_finished": ("before the reply was finished", "قبل أن يكتمل الرد"),
    "chat_notice_raise_limit": ("Raise max_new_tokens for a longer reply.",
                                "ارفع max_new_tokens للحصول على رد أطول."),
    "chat_notice_raise_limit_thinking": (
        "Raise max_new_tokens for a longer reply (reasoning often takes many more tokens than the answer), "
        "or turn thinking off.",
        "ارفع max_new_tokens للحصول على رد أطول (كثيرًا ما يستهلك الاستدلال رموزًا أكثر بكثير من الإجابة)، "
        "أو أوقف التفكير."),
    "chat_notice_greedy_thinking": ("Greedy decoding with thinking on", "فك ترميز جشع مع تشغيل التفكير"),
    # Qwen3's model card, "Best Practices"
    "chat_greedy_thinking_advice": (
        "Qwen advises against greedy decoding with thinking on: \"DO NOT use greedy decoding, as it can lead to "
        "performance degradation and endless repetitions.\" Untick Greedy to sample with its thinking defaults "
        "(temperature 0.6, top_p 0.95, top_k 20).",
        "تنصح Qwen بعدم استخدام فك الترميز الجشع مع تشغيل التفكير: «لا تستخدم فك الترميز الجشع، فقد يؤدي إلى "
        "تراجع الأداء وتكرار لا ينتهي». ألغِ تحديد «جشع» لأخذ العينات بإعدادات التفكير الافتراضية "
        "(temperature 0.6، top_p 0.95، top_k 20)."),
    # ----- request checks (chat/text.py) ---------------------------------------------------------------
    "chat_err_request_fields": ("Chat request fields {fields} are not valid; allowed: {allowed} "
                                "(message is required).",
                                "حقول طلب المحادثة {fields} غير صالحة؛ المسموح: {allowed} (الحقل message إلزامي)."),
    "chat_err_request_type": ("A chat request must be a ChatRequest or a dict of its fields.",
                              "يجب أن يكون طلب المحادثة ChatRequest أو قاموسًا (dict) بحقوله."),
    "chat_err_empty_message": ("The message is empty: type something to send.",
                               "الرسالة فارغة: اكتب شيئًا لإرساله."),
    "chat_err_flag": ("{name} must be true or false, got {value}.",
                      "{name}: يجب أن تكون القيمة true أو false، والقيمة المُرسَلة {value}."),
    "chat_err_real_range": ("{name} must be a number from {low} to {high} (for the most likely token every time, "
                            "use greedy), got {value}.",
                            "{name}: يجب أن تكون القيمة عددًا من {low} إلى {high} (لاختيار الرمز الأرجح في كل مرة "
                            "استخدم الوضع الجشع)، والقيمة المُرسَلة {value}."),
    "chat_err_real_positive": ("{name} must be a number above 0 and at most {high}, got {value}.",
                               "{name}: يجب أن تكون القيمة عددًا أكبر من 0 ولا يتجاوز {high}، والقيمة المُرسَلة {value}."),
    "chat_err_whole_range": ("{name} must be a whole number from {low} to {high}, got {value}.",
                             "{name}: يجب أن تكون القيمة عددًا صحيحًا من {low} إلى {high}، والقيمة المُرسَلة {value}."),
    "chat_err_whole_min": ("{name} must be a whole number of {low} or more, got {value}.",
                           "{name}: يجب أن تكون القيمة عددًا صحيحًا لا يقل عن {low}، والقيمة المُرسَلة {value}."),
    "chat_value_digits": ("a whole number of about {digits} digits", "عدد صحيح من نحو {digits} خانة"),
    # ----- texts and history (chat/history.py) ---------------------------------------------------------
    "chat_what_message": ("The message", "الرسالة"),
    "chat_what_system_prompt": ("The system prompt", "موجّه النظام"),
    "chat_what_history_item": ("The content of history item {index}", "محتوى العنصر {index} من السجل"),
    "chat_what_a_message": ("A message", "رسالة"),
    "chat_what_reasoning": ("A reply's reasoning", "استدلال رد"),
    "chat_what_notice": ("A notice", "تنبيه"),
    "chat_err_not_text": ("{what} must be text, got {kind}.", "{what}: المطلوب نص، والمُرسَل من النوع {kind}."),
    "chat_err_too_long": ("{what} is {length} characters; at most {limit} are allowed.",
                          "{what}: الطول {length} حرفًا؛ والحد الأقصى المسموح {limit}."),
    "chat_err_surrogate": ("{what} holds a lone surrogate ({char}) at character {at}, which is not valid Unicode; "
                           "send UTF-8 text.",
                           "{what}: يوجد بديل منفرد (surrogate) ({char}) عند الحرف {at}، وهذا ليس Unicode صالحًا؛ "
                           "أرسل نصًا بترميز UTF-8."),
    "chat_err_part_type": ("{where} has a part of type {kind}; only text parts are accepted.",
                           "{where}: يوجد جزء من النوع {kind}؛ لا تُقبل إلا الأجزاء النصية."),
    "chat_err_content_type": ("{where} must be text or a list of text parts, got {kind}.",
                              "{where}: المطلوب نص أو قائمة أجزاء نصية، والمُرسَل من النوع {kind}."),
    "chat_history_allowed": ('a list of {{"role": "user" or "assistant", "content": text or a list of text parts}}, '
                             'oldest first (an exported conversation\'s "messages" work as they are)',
                             'قائمة من {{"role": "user" أو "assistant"، "content": نص أو قائمة أجزاء نصية}}، '
                             'الأقدم أولًا (يصلح الحقل "messages" من محادثة مُصدَّرة كما هو)'),
    "chat_err_history_type": ("The history must be {allowed}; got {kind}.",
                              "السجل: يجب أن يكون {allowed}؛ والمُرسَل من النوع {kind}."),
    "chat_err_history_messages": ("The history has {count} messages; this server accepts at most {limit}. Send only "
                                  "the newest ones (old turns that do not fit the prompt are dropped anyway).",
                                  "عدد الرسائل في السجل {count}؛ وهذا الخادم يقبل {limit} على الأكثر. أرسل أحدثها فقط "
                                  "(الأدوار القديمة التي لا تتسع في الموجّه تُسقَط على أي حال)."),
    "chat_err_history_item": ("History item {index} is not valid: it must be {allowed}.",
                              "العنصر {index} من السجل غير صالح: يجب أن يكون السجل {allowed}."),
    "chat_err_history_chars": ("The history holds more than {limit} characters; this server accepts at most {limit}. "
                               "Send only the newest messages.",
                               "عدد الأحرف في السجل يتجاوز {limit}؛ وهذا الخادم يقبل {limit} على الأكثر. "
                               "أرسل أحدث الرسائل فقط."),
    "chat_err_not_export": ("This file is not a conversation exported by this app (its \"format\" must be {format}).",
                            "هذا الملف ليس محادثة صدّرها هذا التطبيق (يجب أن تكون قيمة \"format\" فيه {format})."),
    "chat_err_export_version": ("Conversation export version {version} is not supported; this app reads version "
                                "{supported}.",
                                "الإصدار {version} من ملف المحادثة غير مدعوم؛ هذا التطبيق يقرأ الإصدار {supported}."),
    # a conversation file loaded in the Chat tab (ui/chat_export.py)
    "chat_err_file_too_large": ("The file is {size} bytes; a conversation file may be at most {limit} bytes.",
                                "حجم الملف {size} بايت؛ والحد الأقصى لملف المحادثة {limit} بايت."),
    "chat_err_file_not_json": ("The file is not a JSON conversation export ({error}).",
                               "الملف ليس محادثة مُصدَّرة بصيغة JSON ({error})."),
    # ----- prompt, engine, batch (chat/prompt.py, chat/engine.py, chat/batch.py) -------------------------
    "chat_err_prompt_too_long": ("The message takes {tokens} tokens with the chat template; the longest prompt this "
                                 "server accepts is {limit} tokens. Shorten the message.",
                                 "تأخذ الرسالة {tokens} رمزًا مع قالب المحادثة؛ وأطول موجّه يقبله هذا الخادم "
                                 "{limit} رمزًا. اختصر الرسالة."),
    "chat_err_prompt_too_long_system": ("The message and the system prompt take {tokens} tokens with the chat "
                                        "template; the longest prompt this server accepts is {limit} tokens. "
                                        "Shorten the message or the system prompt.",
                                        "تأخذ الرسالة وموجّه النظام {tokens} رمزًا مع قالب المحادثة؛ وأطول موجّه "
                                        "يقبله هذا الخادم {limit} رمزًا. اختصر الرسالة أو موجّه النظام."),
    "chat_err_no_template": ("The chat model in {folder} has no chat template; use an instruct model.",
                             "نموذج المحادثة في {folder} بلا قالب محادثة؛ استخدم نموذجًا موجَّهًا (instruct)."),
    "chat_err_unknown_shape": ("Unknown chat shape {shape}; allowed: {allowed}.",
                               "شكل المحادثة {shape} غير معروف؛ المسموح: {allowed}."),
    "chat_err_not_loaded": ("The chat model is not loaded yet; try again shortly.",
                            "لم يُحمَّل نموذج المحادثة بعد؛ حاول مجددًا بعد قليل."),
    "chat_err_batch_stopped": ("The chat batch scheduler stopped; restart the app.",
                               "توقّف مُجدوِل دفعات المحادثة؛ أعد تشغيل التطبيق."),
    # ----- the chat shapes of the warm-up plan (chat/engine.py, chat/prefill.py) -------------------------
    "chat_shape_bucket": ("prompt bucket {bucket} tokens, {prefill}", "حاوية الموجّه {bucket} رمزًا، {prefill}"),
    "chat_shape_decode": ("{shape} + the decode graphs (cache {context} tokens, windows {windows})",
                          "{shape} + رسوم فك الترميز (ذاكرة مؤقتة {context} رمزًا، النوافذ {windows})"),
    "chat_shape_batch": ("{shape}, batch {batch}", "{shape}، دفعة {batch}"),
    "chat_prefill_eager": ("eager prefill", "ملء أولي فوري (eager)"),
    "chat_prefill_one_chunk": ("compiled prefill: 1 chunk of {chunk} tokens over {windows}",
                               "ملء أولي مُترجَم: قطعة واحدة من {chunk} رمزًا على {windows}"),
    "chat_prefill_chunks": ("compiled prefill: {count} chunks of {chunk} tokens over {windows}",
                            "ملء أولي مُترجَم: {count} قطع من {chunk} رمزًا على {windows}"),
    "chat_prefill_window": ("window {windows}", "النافذة {windows}"),
    "chat_prefill_windows": ("windows {windows}", "النوافذ {windows}"),
    # ----- feedback (feedback.py) ----------------------------------------------------------------------
    "chat_err_feedback_rating": ("Feedback rating {rating} is not one of {allowed}.",
                                 "التقييم {rating} ليس من القيم {allowed}."),
    "chat_err_feedback_no_prompt": ("Only a reply to a user message can be marked.",
                                    "لا يُقيَّم إلا رد على رسالة من المستخدم."),
    "chat_err_feedback_too_large": ("This mark is larger than the feedback file may grow ({limit} bytes, "
                                    "--feedback-max-bytes); it was not stored.",
                                    "هذا التقييم أكبر مما يُسمح لملف التقييمات أن يبلغه ({limit} بايت، "
                                    "--feedback-max-bytes)؛ فلم يُحفَظ."),
    "chat_err_feedback_prompt_long": ("The marked prompt is {length} characters; a mark may hold at most {limit} "
                                      "(--max-prompt-chars); it was not stored.",
                                      "طول الطلب المُقيَّم {length} حرفًا؛ والحد الأقصى للتقييم {limit} "
                                      "(‎--max-prompt-chars)؛ فلم يُحفَظ."),
    "chat_err_feedback_reply_long": ("The marked reply is {length} characters; a reply of this server is at most "
                                     "{limit} ({per_token} per token of --max-new-tokens); it was not stored.",
                                     "طول الرد المُقيَّم {length} حرفًا؛ وأطول رد يُنتجه هذا الخادم {limit} "
                                     "({per_token} لكل رمز من ‎--max-new-tokens)؛ فلم يُحفَظ."),
    "chat_err_feedback_session_cap": ("This session has stored {limit} marks, the most one session may store; "
                                      "this one was not stored.",
                                      "خزّنت هذه الجلسة {limit} تقييمًا، وهو أقصى ما تُخزّنه جلسة واحدة؛ "
                                      "فلم يُحفَظ هذا التقييم."),
    "chat_err_feedback_full": ("The feedback storage is full; marks are not stored until the operator archives "
                               "the files under <cache-dir>/feedback.",
                               "مخزن التقييمات ممتلئ؛ لن تُحفَظ تقييمات حتى يؤرشف المشغّل الملفات في "
                               "‎<cache-dir>/feedback."),
    "chat_err_comment_too_long": ("The comment is {length} characters; at most {limit} are allowed.",
                                  "طول التعليق {length} حرفًا؛ والحد الأقصى المسموح {limit}."),
}

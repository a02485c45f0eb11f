"""Everything but the UI: settings, devices, shapes, engines, warm-up and the Backend. Never imports Gradio."""

"""The variables neuron_backend.compile_cache sets in ``os.environ``: a fresh start of the app has none of them."""

COMPILE_CACHE_VARIABLES = ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
                           "TORCH_NEURONX_HLO_CACHE_DIR", "NKI_TRACE_CACHE_URL", "TORCHINDUCTOR_CACHE_DIR",
                           "SHOWCASE_COMPILE_CACHE_SET")

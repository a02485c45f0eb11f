"""The image wing: the FLUX.2-klein engine, request checks and PNG parameters."""

"""What several parts of kfast share and none of them owns: the process topology (rank and size, set by
the engine that starts the job), argument checks, messages to the user, fit timing, the CPU count, GPU
sampling, callback ordering and TensorFlow's start-up noise. Private: nothing here is public API."""

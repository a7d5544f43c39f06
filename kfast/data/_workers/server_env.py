"""The environment variables the training process hands multiprocessing's fork server (read there by
`server_path` and `janitor`, set around each worker start by `pool`). Only names: importing this module
does nothing, so the fork server's preloads and the pool can share it."""

PATH_VARIABLE = "KFAST_MP_SYS_PATH"  # the training process's sys.path, as JSON
TEMP_DIR_VARIABLE = "KFAST_MP_TEMP_DIR"  # multiprocessing's temporary directory of the training process

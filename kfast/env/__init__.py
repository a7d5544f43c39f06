"""The machine kfast runs on: `doctor` reports on this host, `preflight` checks the hosts of a launch,
`horovod_build` reads what Horovod was built with."""

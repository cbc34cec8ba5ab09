"""Measuring on real devices over SSH: devices.toml, the OpenSSH transport, remote validation, pools."""

"""GENIE-style emulation: rank processes that sleep for compute and send real bytes."""

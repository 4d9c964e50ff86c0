"""What a run was asked, and whether it can run: the request from the
flags, the config's values, init_from, the class names."""

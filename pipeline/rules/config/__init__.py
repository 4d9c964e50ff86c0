"""What a run was asked, and whether it can run: the request from the
flags (request.py), the config's values (validation.py), init_from, the
class names (classes.py)."""

"""Scripts the launcher runs in child processes, by path, under the training
environment's interpreter. The only modules that import torch; each uses the
standard library and torch alone, and runs by hand too (see its --help)."""

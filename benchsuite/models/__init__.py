"""Plain PyTorch models, no parallelism inside: the decoder, its FFN, the mixture-of-experts layer and its routers."""

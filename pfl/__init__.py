"""pfl: personalized federated learning on PyTorch Lightning."""

__version__ = "0.1.0"

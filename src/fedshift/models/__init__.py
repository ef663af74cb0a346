"""Registered model factories and structures. Importing this package registers every model."""

from .base import MODELS, FedModel, create_model, make_norm  # noqa: F401
from . import lenet  # noqa: F401
from . import alexnet, cnn, efficientnet, googlenet, mobilenet, resnet, shufflenet, vgg  # noqa: F401
from .structures import STRUCTURES, Structure, get_structure, sync_homogeneous  # noqa: F401

sync_homogeneous()  # homo_<model> for every model imported above

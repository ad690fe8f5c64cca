"""Epilogue functors and activations."""
from .activations import (ACTIVATIONS, Activation, gelu, gelu_taylor, hardswish, identity, leaky_relu, relu, sigmoid,
                          silu, tanh)
from .functors import (EpilogueArguments, EpilogueFunctor, FastLinearCombinationClamp, LinearCombination,
                       LinearCombinationClamp, LinearCombinationGeneric)

__all__ = ["ACTIVATIONS", "Activation", "EpilogueArguments", "EpilogueFunctor", "FastLinearCombinationClamp",
           "LinearCombination", "LinearCombinationClamp", "LinearCombinationGeneric", "gelu", "gelu_taylor",
           "hardswish", "identity", "leaky_relu", "relu", "sigmoid", "silu", "tanh"]

"""Tests of the ops: the contract battery (engine and bare kernels), references, physics."""

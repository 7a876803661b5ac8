"""Library code and user code (fingerprint/libraries.py), by where their files are."""

import json
import os

import pyro
import torch

import pyro_sgmcmc
from pyro_sgmcmc.fingerprint.libraries import is_library_file, is_library_module


def test_installed_packages_the_standard_library_and_this_package_are_libraries():
    for module in (torch, pyro, json, os, pyro_sgmcmc):
        assert is_library_module(module), module.__name__
    assert is_library_file("<frozen importlib._bootstrap>")
    assert is_library_file("/any/env/lib/python3.11/site-packages/some_package/module.py")


def test_the_user_s_files_scripts_and_prompts_are_user_code():
    assert not is_library_file(__file__)
    for name in ("<stdin>", "<string>", "<ipython-input-3-abc>", "/home/someone/project/model.py"):
        assert not is_library_file(name), name

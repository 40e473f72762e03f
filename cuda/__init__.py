"""CUDA C++ kernel sources for dgl_rsc, shipped as package data (``dgl_rsc.cuda``)."""

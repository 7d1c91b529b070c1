"""Declarations: the kernelfile, the target graph, the GPU catalog, declaration checks."""

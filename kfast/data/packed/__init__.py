"""Packed data: `pack` writes ArrayRecord shards and their metadata, `PackedDataset` reads them by global sample
index, from a folder or object storage."""

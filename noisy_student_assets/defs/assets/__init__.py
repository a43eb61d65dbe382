"""Dagster assets: each reads its inputs, calls one domain function, writes its output and metadata."""

"""Dagster resources and IO managers of noisy-student."""

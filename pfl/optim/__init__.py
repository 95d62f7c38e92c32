"""Reusable optimisation pieces shared by methods."""

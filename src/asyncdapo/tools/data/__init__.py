"""Datasets: verl-layout loading and synthetic arithmetic problems."""

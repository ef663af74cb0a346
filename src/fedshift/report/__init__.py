"""Tidy results -> paper-style tables (FCCL+ Tables VIII/IX) and seaborn figures."""

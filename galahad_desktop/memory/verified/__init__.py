"""Verified answers: the library of checked question/answer pairs and their checkers."""

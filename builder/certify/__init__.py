"""Certification: run the in-image bench on N nodes through a launcher, judge what the ranks
reported, write the certificate (settings -> run -> verdict -> certificate)."""

"""llama.cpp session: model load, runtime fingerprint, token ledger, decode loop, KV graft."""

//! Code emitters (Triton; the lower issue builds it).

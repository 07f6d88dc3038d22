//! Kernel graphs from tiled programs (the lower issue builds it).

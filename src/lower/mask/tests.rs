//! Interval analysis against brute force.

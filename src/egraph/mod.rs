//! The typed e-graph and equality rules (the saturate issue builds it).

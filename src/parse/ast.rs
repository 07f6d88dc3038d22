//! The syntax tree the grammar produces. The tree is close to the text; name
//! resolution, operator arity and attribute checking happen when it is built into the IR
//! (`super::build`), where errors can point at precise spans.

use crate::ir::Dim;

pub type Loc = (usize, usize);

#[derive(Clone, Debug, PartialEq)]
pub enum TypeAst {
    Tensor {
        shape: Vec<Dim>,
        dtype: (String, Loc),
        state: Vec<StateEntryAst>,
        loc: Loc,
    },
    Tuple(Vec<TypeAst>, Loc),
}

#[derive(Clone, Debug, PartialEq)]
pub struct StateEntryAst {
    pub kind: String,
    pub args: Vec<(String, Loc)>,
    pub loc: Loc,
}

#[derive(Clone, Debug, PartialEq)]
pub enum BracketArg {
    Word(String),
    Int(u64),
    Number(f64),
    Shape(Vec<Dim>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Word(String),
    Int(u64),
    Number(f64),
    Reducer(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Attr {
    pub key: String,
    pub value: Option<AttrValue>,
    pub loc: Loc,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InfixOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprAst {
    Name(String),
    Number(f64),
    Neg(Box<Expr>),
    Infix(InfixOp, Box<Expr>, Box<Expr>),
    Call {
        op: String,
        op_loc: Loc,
        brackets: Option<Vec<(BracketArg, Loc)>>,
        args: Option<Vec<Expr>>,
        attrs: Vec<Attr>,
    },
    Reduce {
        input: Box<Expr>,
        attrs: Vec<Attr>,
    },
    Input,
    Constant(Box<Expr>),
    /// `<a, b>` — a tuple literal (reducer init values).
    Angle(Vec<Expr>),
    /// `%3` — an e-class reference (e-graph dumps only).
    ClassRef(u32),
    /// `input 0` — the argument at a position (e-graph dumps only).
    InputAt(u64),
    /// `call @f(a, b)` — the results of function `f` on `a, b` (`keyword` must be `call`).
    FuncCall {
        keyword: String,
        name: String,
        name_loc: Loc,
        args: Vec<Expr>,
    },
}

/// An expression with its source range and nesting depth (bounded by the grammar).
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub ast: ExprAst,
    pub loc: Loc,
    pub depth: u32,
}

/// Expressions nested deeper than this are rejected while parsing: the builder and printer
/// recurse over nesting, and a long chain like `a + a + … + a` must not overflow their stack.
pub const MAX_EXPR_DEPTH: u32 = 200;

/// Builds `a op b`, checking the depth at every step so a long chain `a + a + … + a` stops
/// at the limit in linear time.
pub fn infix(
    op: InfixOp,
    a: Expr,
    b: Expr,
    loc: Loc,
) -> Result<Expr, crate::parse::lexer::LexError> {
    let depth = 1 + a.depth.max(b.depth);
    if depth > MAX_EXPR_DEPTH {
        return Err(crate::parse::lexer::LexError {
            start: loc.0,
            end: loc.1,
            message: format!("expression nests deeper than {MAX_EXPR_DEPTH} levels"),
            help: Some("name intermediate values with statements instead of nesting".into()),
        });
    }
    Ok(Expr {
        ast: ExprAst::Infix(op, Box::new(a), Box::new(b)),
        loc,
        depth,
    })
}

impl Expr {
    pub fn new(ast: ExprAst, loc: Loc, children: &[&Expr]) -> Expr {
        let depth = 1 + children.iter().map(|c| c.depth).max().unwrap_or(0);
        Expr { ast, loc, depth }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    Let {
        name: String,
        name_loc: Loc,
        annot: Option<Box<TypeAst>>,
        expr: Box<Expr>,
    },
    Return {
        values: Vec<Expr>,
        loc: Loc,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct BindingAst {
    pub name: String,
    pub value: SizeAst,
    pub loc: Loc,
}

/// A size in a `where` binding: an integer, a dimension symbol, or `+ - *` of sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeAst {
    pub kind: SizeAstKind,
    pub loc: Loc,
    pub depth: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SizeAstKind {
    Int(u64),
    Name(String),
    /// `+`, `-` or `*` and the operands.
    Bin(char, Box<SizeAst>, Box<SizeAst>),
}

impl SizeAst {
    /// `a op b`, refused past [`MAX_EXPR_DEPTH`] as expressions are.
    pub fn bin(
        op: char,
        a: SizeAst,
        b: SizeAst,
        loc: Loc,
    ) -> Result<SizeAst, crate::parse::lexer::LexError> {
        let depth = 1 + a.depth.max(b.depth);
        if depth > MAX_EXPR_DEPTH {
            return Err(crate::parse::lexer::LexError {
                start: loc.0,
                end: loc.1,
                message: format!("size expression nests deeper than {MAX_EXPR_DEPTH} levels"),
                help: Some("define intermediate sizes as their own bindings".into()),
            });
        }
        Ok(SizeAst {
            kind: SizeAstKind::Bin(op, Box::new(a), Box::new(b)),
            loc,
            depth,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct FuncAst {
    pub name: String,
    pub name_loc: Loc,
    pub bindings: Vec<BindingAst>,
    /// `schedule(m = 64, num_warps = 4)`: each entry's name, value and location.
    pub schedule: Option<Vec<(String, String, Loc)>>,
    pub stmts: Vec<Stmt>,
}

/// `state = <a, b>`: the keyword with its location and the field names with theirs.
pub type ReducerParam = (String, Loc, Vec<(String, Loc)>);

#[derive(Clone, Debug, PartialEq)]
pub struct ReducerAst {
    pub name: String,
    pub name_loc: Loc,
    /// `(keyword, names)` for the `state = <…>` and `item = <…>` parts, in written order.
    pub params: Vec<ReducerParam>,
    pub init_key: (String, Loc),
    pub init: Vec<Expr>,
    pub stmts: Vec<Stmt>,
}

/// `eclass %3 : TYPE { enode… }` or `root %12, %13` inside an `egraph` dump.
#[derive(Clone, Debug, PartialEq)]
pub enum EGraphEntry {
    Class {
        keyword: (String, Loc),
        id: (u32, Loc),
        ty: TypeAst,
        nodes: Vec<Expr>,
    },
    Roots {
        keyword: (String, Loc),
        ids: Vec<(u32, Loc)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct EGraphAst {
    pub keyword: (String, Loc),
    pub name: String,
    pub name_loc: Loc,
    pub bindings: Vec<BindingAst>,
    pub entries: Vec<EGraphEntry>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Func(FuncAst),
    Reducer(ReducerAst),
    EGraph(EGraphAst),
}

//! The subset of kubectl-style JSONPath that CRD `additionalPrinterColumns`
//! use: `.a.b`, `.a['b.c']`, `[n]` (negative from the end), `[a:b:c]`,
//! `[*]`, `.*`, `..name`, unions `[0,1]` / `['a','b']`, filters
//! `[?(@.type=="Ready")]` with `== != < <= > >=` or a bare `@.x` existence
//! test, and the template wrapper `{.spec.x}` (optionally `{$.spec.x}`).
//! Templates with several `{}` blocks or `range` are not supported.

use serde_json::Value;

/// Walking deeper than this in `..` would only serve hostile input.
const MAX_DEPTH: usize = 64;
/// Bound on input size; printer-column paths are short.
const MAX_LEN: usize = 4096;

/// A parsed JSONPath expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Slice(Option<i64>, Option<i64>, i64),
    Wildcard,
    /// `..`: the following step applies to the value and all its descendants.
    Descend,
    Union(Vec<Step>),
    Filter(Filter),
}

#[derive(Debug, Clone, PartialEq)]
enum Filter {
    Exists(Path),
    Cmp(Operand, Op, Operand),
}

#[derive(Debug, Clone, PartialEq)]
enum Operand {
    /// `@...`, relative to the element under test.
    Current(Path),
    Lit(Value),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Parses an expression such as `.status.conditions[?(@.type=="Ready")].status`
/// or `{.spec.replicas}`. A leading `$` and a first field without a dot
/// (`spec.x`) are accepted.
pub fn parse(expr: &str) -> Result<Path, String> {
    if expr.len() > MAX_LEN {
        return Err(format!("jsonpath expression longer than {MAX_LEN} bytes"));
    }
    let mut t = expr.trim();
    if let Some(rest) = t.strip_prefix('{') {
        t = rest
            .strip_suffix('}')
            .ok_or_else(|| format!("unclosed '{{' in jsonpath {expr:?}"))?
            .trim();
        if t.contains('{') || t.contains('}') {
            return Err(format!(
                "nested or multiple templates are not supported: {expr:?}"
            ));
        }
    }
    if t.is_empty() {
        return Err("empty jsonpath expression".to_string());
    }
    let mut p = Parser {
        s: t.chars().collect(),
        i: 0,
    };
    if p.peek() == Some('$') {
        p.i += 1;
    }
    let steps = p.steps(true, 0)?;
    p.ws();
    if let Some(c) = p.peek() {
        return Err(format!(
            "unexpected character {c:?} at position {} in jsonpath {expr:?}",
            p.i
        ));
    }
    Ok(Path { steps })
}

struct Parser {
    s: Vec<char>,
    i: usize,
}

/// Characters that end a bare field name.
fn is_name_char(c: char) -> bool {
    !c.is_whitespace() && !".[](){}'\"=!<>,&|@$*:?".contains(c)
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }
    fn ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected {c:?} at position {}", self.i))
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.i;
        while self.peek().is_some_and(is_name_char) {
            self.i += 1;
        }
        if start == self.i {
            return Err(format!("expected a field name at position {start}"));
        }
        Ok(self.s[start..self.i].iter().collect())
    }

    /// Steps until something that cannot continue a path. `first` allows a
    /// leading bare name (`spec.x`).
    fn steps(&mut self, first: bool, depth: usize) -> Result<Vec<Step>, String> {
        if depth > 8 {
            return Err("filters nested too deeply".to_string());
        }
        let mut steps = Vec::new();
        if first && self.peek().is_some_and(is_name_char) {
            steps.push(Step::Field(self.name()?));
        }
        loop {
            match self.peek() {
                Some('.') => {
                    self.i += 1;
                    if self.eat('.') {
                        steps.push(Step::Descend);
                        // `..[0]` and `..*` are fine too
                        if self.peek() == Some('[') {
                            continue;
                        }
                    }
                    if self.eat('*') {
                        steps.push(Step::Wildcard);
                    } else if self.peek() == Some('[') {
                        // `.['a']` — tolerated, same as `['a']`
                        continue;
                    } else {
                        steps.push(Step::Field(self.name()?));
                    }
                }
                Some('[') => {
                    self.i += 1;
                    steps.push(self.bracket(depth)?);
                }
                _ => break,
            }
        }
        if steps.last() == Some(&Step::Descend) {
            return Err("'..' must be followed by a field name".to_string());
        }
        Ok(steps)
    }

    /// Inside `[...]`, after the `[`.
    fn bracket(&mut self, depth: usize) -> Result<Step, String> {
        self.ws();
        if self.eat('?') {
            self.ws();
            self.expect('(')?;
            let f = self.filter(depth)?;
            self.ws();
            self.expect(')')?;
            self.ws();
            self.expect(']')?;
            return Ok(Step::Filter(f));
        }
        let mut items = Vec::new();
        loop {
            self.ws();
            let item = match self.peek() {
                Some('*') => {
                    self.i += 1;
                    Step::Wildcard
                }
                Some('\'') | Some('"') => Step::Field(self.quoted()?),
                _ => self.index_or_slice()?,
            };
            items.push(item);
            self.ws();
            if self.eat(']') {
                break;
            }
            self.expect(',')?;
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Step::Union(items)
        })
    }

    fn int(&mut self) -> Result<Option<i64>, String> {
        self.ws();
        let start = self.i;
        if self.peek() == Some('-') {
            self.i += 1;
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        if start == self.i {
            return Ok(None);
        }
        let text: String = self.s[start..self.i].iter().collect();
        text.parse::<i64>()
            .map(Some)
            .map_err(|_| format!("invalid array index {text:?}"))
    }

    fn index_or_slice(&mut self) -> Result<Step, String> {
        let a = self.int()?;
        self.ws();
        if !self.eat(':') {
            return a.map(Step::Index).ok_or_else(|| {
                format!(
                    "expected an index, '*', a quoted name or a filter at position {}",
                    self.i
                )
            });
        }
        let b = self.int()?;
        self.ws();
        let step = if self.eat(':') {
            self.int()?.unwrap_or(1)
        } else {
            1
        };
        if step <= 0 {
            return Err("slice step must be positive".to_string());
        }
        Ok(Step::Slice(a, b, step))
    }

    /// A single- or double-quoted string with backslash escapes.
    fn quoted(&mut self) -> Result<String, String> {
        let q = self.peek().ok_or("expected a quote")?;
        self.i += 1;
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err("unterminated string in jsonpath".to_string()),
                Some(c) if c == q => {
                    self.i += 1;
                    return Ok(out);
                }
                Some('\\') => {
                    self.i += 1;
                    let c = self.peek().ok_or("unterminated escape in jsonpath")?;
                    out.push(match c {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                    self.i += 1;
                }
                Some(c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    fn filter(&mut self, depth: usize) -> Result<Filter, String> {
        self.ws();
        let lhs = self.operand(depth)?;
        self.ws();
        let op = match (self.peek(), self.s.get(self.i + 1).copied()) {
            (Some('='), Some('=')) => Some((Op::Eq, 2)),
            (Some('!'), Some('=')) => Some((Op::Ne, 2)),
            (Some('<'), Some('=')) => Some((Op::Le, 2)),
            (Some('>'), Some('=')) => Some((Op::Ge, 2)),
            (Some('<'), _) => Some((Op::Lt, 1)),
            (Some('>'), _) => Some((Op::Gt, 1)),
            _ => None,
        };
        let Some((op, n)) = op else {
            return match lhs {
                Operand::Current(p) => Ok(Filter::Exists(p)),
                Operand::Lit(_) => Err("a filter needs '@' or a comparison".to_string()),
            };
        };
        self.i += n;
        self.ws();
        let rhs = self.operand(depth)?;
        Ok(Filter::Cmp(lhs, op, rhs))
    }

    fn operand(&mut self, depth: usize) -> Result<Operand, String> {
        match self.peek() {
            Some('@') => {
                self.i += 1;
                Ok(Operand::Current(Path {
                    steps: self.steps(false, depth + 1)?,
                }))
            }
            Some('\'') | Some('"') => Ok(Operand::Lit(Value::String(self.quoted()?))),
            Some(c) if c == '-' || c.is_ascii_digit() => {
                let start = self.i;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_digit() || "-+.eE".contains(c))
                {
                    self.i += 1;
                }
                let text: String = self.s[start..self.i].iter().collect();
                serde_json::from_str::<serde_json::Number>(&text)
                    .map(|n| Operand::Lit(Value::Number(n)))
                    .map_err(|_| format!("invalid number {text:?} in filter"))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let word = self.name()?;
                match word.as_str() {
                    "true" => Ok(Operand::Lit(Value::Bool(true))),
                    "false" => Ok(Operand::Lit(Value::Bool(false))),
                    "null" => Ok(Operand::Lit(Value::Null)),
                    _ => Err(format!(
                        "unexpected word {word:?} in filter (strings must be quoted)"
                    )),
                }
            }
            other => Err(format!(
                "unexpected {other:?} in filter at position {}",
                self.i
            )),
        }
    }
}

/// Evaluates `path` against `obj`; every matching value, in document order
/// (object members in the map's iteration order). Missing fields simply
/// produce no result.
pub fn eval<'a>(path: &Path, obj: &'a Value) -> Vec<&'a Value> {
    let mut cur = vec![obj];
    let mut descend = false;
    for step in &path.steps {
        if *step == Step::Descend {
            descend = true;
            continue;
        }
        if descend {
            let mut all = Vec::new();
            for v in &cur {
                collect_all(v, 0, &mut all);
            }
            cur = all;
            descend = false;
        }
        let mut next = Vec::new();
        for v in cur {
            apply(step, v, &mut next);
        }
        cur = next;
        if cur.is_empty() {
            break;
        }
    }
    cur
}

/// `v` and every value below it, pre-order.
fn collect_all<'a>(v: &'a Value, depth: usize, out: &mut Vec<&'a Value>) {
    out.push(v);
    if depth >= MAX_DEPTH {
        return;
    }
    match v {
        Value::Array(a) => a.iter().for_each(|c| collect_all(c, depth + 1, out)),
        Value::Object(m) => m.values().for_each(|c| collect_all(c, depth + 1, out)),
        _ => {}
    }
}

fn children(v: &Value) -> Box<dyn Iterator<Item = &Value> + '_> {
    match v {
        Value::Array(a) => Box::new(a.iter()),
        Value::Object(m) => Box::new(m.values()),
        _ => Box::new(std::iter::empty()),
    }
}

/// Resolves a possibly negative index against `len`.
fn norm(i: i64, len: usize) -> Option<usize> {
    let len = len as i64;
    let j = if i < 0 { len + i } else { i };
    (0..len).contains(&j).then_some(j as usize)
}

fn apply<'a>(step: &Step, v: &'a Value, out: &mut Vec<&'a Value>) {
    match step {
        Step::Field(name) => {
            if let Some(c) = v.as_object().and_then(|m| m.get(name)) {
                out.push(c);
            }
        }
        Step::Index(i) => {
            if let Some(a) = v.as_array()
                && let Some(j) = norm(*i, a.len())
            {
                out.push(&a[j]);
            }
        }
        Step::Slice(start, end, step) => {
            if let Some(a) = v.as_array() {
                let len = a.len() as i64;
                let clamp = |x: i64| if x < 0 { (len + x).max(0) } else { x.min(len) };
                let s = clamp(start.unwrap_or(0));
                let e = clamp(end.unwrap_or(len));
                let mut k = s;
                while k < e {
                    out.push(&a[k as usize]);
                    k += *step;
                }
            }
        }
        Step::Wildcard => out.extend(children(v)),
        Step::Descend => out.push(v),
        Step::Union(items) => {
            for s in items {
                apply(s, v, out);
            }
        }
        Step::Filter(f) => out.extend(children(v).filter(|c| test(f, c))),
    }
}

fn operand_value<'a>(o: &'a Operand, cur: &'a Value) -> Option<&'a Value> {
    match o {
        Operand::Lit(v) => Some(v),
        Operand::Current(p) => eval(p, cur).into_iter().next(),
    }
}

fn test(f: &Filter, cur: &Value) -> bool {
    match f {
        Filter::Exists(p) => !eval(p, cur).is_empty(),
        Filter::Cmp(l, op, r) => {
            let (Some(a), Some(b)) = (operand_value(l, cur), operand_value(r, cur)) else {
                return false; // a missing side never matches, not even for !=
            };
            use std::cmp::Ordering;
            let ord: Option<Ordering> = match (a, b) {
                (Value::Number(x), Value::Number(y)) => x
                    .as_f64()
                    .zip(y.as_f64())
                    .and_then(|(x, y)| x.partial_cmp(&y)),
                (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
                _ if a == b => Some(Ordering::Equal),
                _ => None,
            };
            match op {
                Op::Eq => ord == Some(Ordering::Equal),
                Op::Ne => ord != Some(Ordering::Equal),
                Op::Lt => ord == Some(Ordering::Less),
                Op::Le => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
                Op::Gt => ord == Some(Ordering::Greater),
                Op::Ge => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
            }
        }
    }
}

/// The printer-column cell for evaluated results: the first result, with
/// strings, numbers, booleans and null as they are and objects/arrays as
/// compact JSON text; no result gives `Value::Null`.
pub fn render(v: &[&Value]) -> Value {
    match v.first() {
        None => Value::Null,
        Some(x @ (Value::Array(_) | Value::Object(_))) => Value::String(x.to_string()),
        Some(x) => (*x).clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj() -> Value {
        json!({
            "metadata": {"name": "web", "labels": {"app.kubernetes.io/name": "x"}},
            "spec": {"cpus": 2, "ratio": 0.5, "on": true, "nil": null, "disks": [{"name": "a", "size": 1}, {"name": "b", "size": 2}, {"name": "c", "size": 3}]},
            "status": {"conditions": [
                {"type": "Scheduled", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "Booting"}
            ], "phase": "Pending"}
        })
    }

    fn cell(expr: &str) -> Value {
        let o = obj();
        render(&eval(
            &parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}")),
            &o,
        ))
    }

    #[test]
    fn printer_column_paths() {
        assert_eq!(cell(".spec.cpus"), json!(2));
        assert_eq!(cell("{.spec.cpus}"), json!(2));
        assert_eq!(cell("{$.spec.cpus}"), json!(2));
        assert_eq!(cell("$.spec.cpus"), json!(2));
        assert_eq!(cell("spec.cpus"), json!(2));
        assert_eq!(cell(" { .status.phase } "), json!("Pending"));
        assert_eq!(cell(".spec.ratio"), json!(0.5));
        assert_eq!(cell(".spec.on"), json!(true));
        assert_eq!(cell(".spec.nil"), Value::Null);
        assert_eq!(cell(".spec.missing"), Value::Null);
        assert_eq!(cell(".spec.cpus.deeper"), Value::Null);
        assert_eq!(
            cell(".metadata.labels['app.kubernetes.io/name']"),
            json!("x")
        );
        assert_eq!(
            cell(r#".metadata.labels["app.kubernetes.io/name"]"#),
            json!("x")
        );
        assert_eq!(
            cell(".metadata.labels.['app.kubernetes.io/name']"),
            json!("x")
        );
        assert_eq!(cell(".spec.disks[1].name"), json!("b"));
        assert_eq!(cell(".spec.disks[-1].name"), json!("c"));
        assert_eq!(cell(".spec.disks[7].name"), Value::Null);
        assert_eq!(cell(".spec.disks[0]"), json!(r#"{"name":"a","size":1}"#));
        assert_eq!(cell(".spec.disks[*].size"), json!(1));
        assert_eq!(
            cell(r#".status.conditions[?(@.type=="Ready")].status"#),
            json!("False")
        );
        assert_eq!(
            cell(r#".status.conditions[?(@.type == 'Ready')].reason"#),
            json!("Booting")
        );
        assert_eq!(
            cell(r#".status.conditions[?(@.type=="Nope")].status"#),
            Value::Null
        );
        assert_eq!(
            cell(".metadata.labels"),
            json!(r#"{"app.kubernetes.io/name":"x"}"#)
        );
    }

    #[test]
    fn multiple_results() {
        let o = obj();
        let names = |e: &str| {
            eval(&parse(e).unwrap(), &o)
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(".spec.disks[*].name"),
            vec![json!("a"), json!("b"), json!("c")]
        );
        assert_eq!(
            names(".spec.disks.*.name"),
            vec![json!("a"), json!("b"), json!("c")]
        );
        assert_eq!(names(".spec.disks[0:2].name"), vec![json!("a"), json!("b")]);
        assert_eq!(names(".spec.disks[::2].name"), vec![json!("a"), json!("c")]);
        assert_eq!(names(".spec.disks[-2:].name"), vec![json!("b"), json!("c")]);
        assert_eq!(names(".spec.disks[0,2].name"), vec![json!("a"), json!("c")]);
        assert_eq!(names(".spec['cpus','ratio']"), vec![json!(2), json!(0.5)]);
        assert_eq!(
            names(".spec.disks[?(@.size > 1)].name"),
            vec![json!("b"), json!("c")]
        );
        assert_eq!(
            names(".spec.disks[?(@.size >= 2)].name"),
            vec![json!("b"), json!("c")]
        );
        assert_eq!(names(".spec.disks[?(@.size < 2)].name"), vec![json!("a")]);
        assert_eq!(
            names(".spec.disks[?(@.size <= 2.0)].name"),
            vec![json!("a"), json!("b")]
        );
        assert_eq!(
            names(".spec.disks[?(@.size == 2.0)].name"),
            vec![json!("b")]
        );
        assert_eq!(
            names(".spec.disks[?(@.name != 'b')].name"),
            vec![json!("a"), json!("c")]
        );
        assert_eq!(
            names(".status.conditions[?(@.reason)].type"),
            vec![json!("Ready")]
        );
        assert_eq!(
            names("..name"),
            vec![json!("web"), json!("a"), json!("b"), json!("c")]
        );
        assert_eq!(names(".spec..size"), vec![json!(1), json!(2), json!(3)]);
        let flags = json!({"items": [{"on": true}, {"on": false}, {"on": null}]});
        let p = parse("[?(@.on==true)]").unwrap();
        assert_eq!(eval(&p, &flags["items"]).len(), 1);
        let p = parse(".items[?(@.on==null)]").unwrap();
        assert_eq!(eval(&p, &flags).len(), 1);
        let p = parse(".items[?(@.on!=false)]").unwrap();
        assert_eq!(eval(&p, &flags).len(), 2);
        // filter on nested @ paths
        let o2 = json!({"l": [{"a": {"b": "x"}, "v": 1}, {"a": {"b": "y"}, "v": 2}]});
        assert_eq!(
            eval(&parse(".l[?(@.a.b=='y')].v").unwrap(), &o2),
            vec![&json!(2)]
        );
    }

    #[test]
    fn render_rules() {
        assert_eq!(render(&[]), Value::Null);
        assert_eq!(render(&[&json!("s"), &json!("t")]), json!("s"));
        assert_eq!(render(&[&json!([1, 2])]), json!("[1,2]"));
        assert_eq!(render(&[&json!(1.25)]), json!(1.25));
        assert_eq!(render(&[&Value::Null]), Value::Null);
    }

    #[test]
    fn bad_expressions_error() {
        for bad in [
            "",
            "   ",
            "{}",
            "{.a",
            ".a}",
            "{.a}{.b}",
            ".",
            ".a.",
            "..",
            ".a..",
            "[",
            "[]",
            "[1",
            "['a'",
            "[\"a]",
            "[?(@.a=='x')",
            "[?(@.a=='x']",
            "[?@.a]",
            "[?()]",
            "[?(@.a==)]",
            "[?(@.a==bare)]",
            "[?('x')]",
            "[1:2:0]",
            "[1:2:-1]",
            "[a]",
            "[99999999999999999999]",
            ".a b",
            ".a[0]x",
            "[?(@.a=='x' && @.b)]",
            "[?(@.a==1e)]",
            ".a[?(@.b=='\\",
            "{range .items[*]}{.name}{end}",
            "$$",
            ".a[-]",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should fail: {:?}", parse(bad));
        }
        assert!(parse(&".a".repeat(5000)).is_err());
    }

    #[test]
    fn odd_inputs_never_panic() {
        let o = obj();
        let exprs = [
            "[*]",
            "..*",
            "..[0]",
            "[-100]",
            "[-1:-100]",
            "[5:1]",
            ".*.*.*",
            "[?(@)]",
            "[?(@ == @)]",
            "[?(@.x < 'a')]",
            "[?(1 == 1)]",
            "[?(@[0]=='a')]",
        ];
        for e in exprs {
            let p = parse(e).unwrap_or_else(|err| panic!("{e}: {err}"));
            for v in [&o, &Value::Null, &json!([]), &json!("s"), &json!([[1]])] {
                let _ = render(&eval(&p, v));
            }
        }
        // deep documents with `..` are bounded
        let mut deep = json!(1);
        for _ in 0..200 {
            deep = json!({"name": deep});
        }
        let r = eval(&parse("..name").unwrap(), &deep);
        assert!(r.len() <= 66);
        // every prefix of a valid expression parses or errors, never panics
        let full = r#"{.status.conditions[?(@.type=="Ready")].status['x',"y"][1:2:3]..z}"#;
        for i in 0..=full.len() {
            let _ = parse(&full[..i]);
        }
        for i in 0..full.len() {
            let _ = parse(&full[i..]);
        }
    }
}

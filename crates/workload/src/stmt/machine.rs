//! `machine <key>=<value>...`: the shape of the model's machine (the kernel
//! backend runs only on the machine it is on, and checks it has that shape).

use crate::ast::{Arch, HvoRuleName, MachineParam, Size};
use crate::checker::{issue, stmt_issue, Checker, Issue, Part};
use crate::line::{parse_int, Line};
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub params: Vec<MachineParam>,
}

const USAGE: &str =
    "machine <key>=<value>... with keys arch=x86_64|arm64, base_page=4K|16K|64K, memory=<size>, hvo=6.18|2021, struct_page=<bytes>, pkeys=on|off";
const KEYS: &str = "expected arch=x86_64|arm64, base_page=4K|16K|64K, memory=<size>, hvo=6.18|2021, struct_page=<bytes>, pkeys=on|off";

impl Machine {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Machine, ParseError> {
        l.arg(1, "machine key", USAGE)?;
        let mut params = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for i in 1..l.toks.len() {
            let t = l.toks[i];
            let Some((key, value)) = t.text.split_once('=') else {
                return Err(l.err(
                    t.col,
                    format!("bad machine setting {}; {KEYS}", quote(t.text)),
                ));
            };
            let vcol = t.col_at(key.len() + 1);
            let (key, param) = match key {
                "arch" => ("arch", MachineParam::Arch(parse_arch(l, value, vcol)?)),
                "base_page" => {
                    let s = l.size_at(value, vcol)?;
                    if !matches!(s.0, 0x1000 | 0x4000 | 0x10000) {
                        return Err(l.err(
                            vcol,
                            format!(
                                "bad base_page {}; expected one of 4K, 16K, 64K",
                                quote(value)
                            ),
                        ));
                    }
                    ("base_page", MachineParam::BasePage(s))
                }
                "memory" => {
                    let s = l.size_at(value, vcol)?;
                    if s.0 == 0 {
                        return Err(l.err(vcol, "machine memory must be nonzero"));
                    }
                    ("memory", MachineParam::Memory(s))
                }
                "hvo" => ("hvo", MachineParam::Hvo(parse_hvo(l, value, vcol)?)),
                "struct_page" => {
                    let n = parse_int(value).map_err(|m| l.err(vcol, m))?;
                    if !(1..=4096).contains(&n) {
                        return Err(l.err(vcol, "struct_page is 1 to 4096 bytes"));
                    }
                    ("struct_page", MachineParam::StructPage(n as u64))
                }
                "pkeys" => ("pkeys", MachineParam::Pkeys(parse_on_off(l, value, vcol)?)),
                _ => {
                    return Err(l.err(t.col, format!("unknown machine key {}; {KEYS}", quote(key))))
                }
            };
            if seen.contains(&key) {
                return Err(l.err(t.col, format!("duplicate machine key '{key}'; {KEYS}")));
            }
            seen.push(key);
            l.mark(Part::MachineKey(key), t.col);
            params.push(param);
        }
        Ok(Machine { params })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        if let Some((at, what)) = c.started {
            return Err(stmt_issue(format!(
                "machine must come before '{what}' at line {at}"
            )));
        }
        if self.params.is_empty() {
            return Err(stmt_issue(
                "machine needs at least one of arch=, base_page=, memory=",
            ));
        }
        for param in &self.params {
            let key = match param {
                MachineParam::Arch(_) => "arch",
                MachineParam::BasePage(_) => "base_page",
                MachineParam::Memory(_) => "memory",
                MachineParam::Hvo(_) => "hvo",
                MachineParam::StructPage(_) => "struct_page",
                MachineParam::Pkeys(_) => "pkeys",
            };
            if let Some(first) = c.machine_keys.get(key) {
                return Err(issue(
                    Part::MachineKey(key),
                    format!("machine key '{key}' already given at line {first}"),
                ));
            }
            match param {
                MachineParam::BasePage(s) if !matches!(s.0, 0x1000 | 0x4000 | 0x10000) => {
                    return Err(issue(
                        Part::MachineKey(key),
                        format!("bad base_page {s}; expected one of 4K, 16K, 64K"),
                    ));
                }
                MachineParam::BasePage(s) => c.base_page = s.0,
                MachineParam::Memory(Size(0)) => {
                    return Err(issue(
                        Part::MachineKey(key),
                        "machine memory must be nonzero",
                    ));
                }
                _ => {}
            }
            c.machine_keys.insert(key, line);
        }
        Ok(())
    }
}

fn parse_arch(l: &Line<'_>, value: &str, vcol: u32) -> Result<Arch, ParseError> {
    match value {
        "x86_64" => Ok(Arch::X86_64),
        "arm64" => Ok(Arch::Arm64),
        _ => Err(l.err(
            vcol,
            format!(
                "unknown arch {}; expected one of x86_64, arm64",
                quote(value)
            ),
        )),
    }
}

fn parse_on_off(l: &Line<'_>, value: &str, vcol: u32) -> Result<bool, ParseError> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(l.err(
            vcol,
            format!("bad pkeys {}; expected on or off", quote(value)),
        )),
    }
}

fn parse_hvo(l: &Line<'_>, value: &str, vcol: u32) -> Result<HvoRuleName, ParseError> {
    match value {
        "6.18" => Ok(HvoRuleName::Linux618),
        "2021" => Ok(HvoRuleName::Series2021),
        _ => Err(l.err(
            vcol,
            format!("unknown hvo rule {}; expected 6.18 or 2021", quote(value)),
        )),
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("machine")?;
        for p in &self.params {
            write!(f, " {p}")?;
        }
        Ok(())
    }
}

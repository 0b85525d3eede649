//! `<proc> thp_disable on|off`: prctl(PR_SET_THP_DISABLE) (kernel/sys.c),
//! the process's mm refusing THPs.

use crate::ast::Name;
use crate::checker::{Checker, Issue};
use crate::line::Line;
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThpDisable {
    pub proc: Name,
    pub on: bool,
}

const USAGE: &str = "<proc> thp_disable on|off";

impl ThpDisable {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<ThpDisable, ParseError> {
        let v = l.arg(2, "on or off", USAGE)?;
        let on = match v.text {
            "on" => true,
            "off" => false,
            _ => {
                return Err(l.err(
                    v.col,
                    format!(
                        "bad thp_disable value {}; expected on or off",
                        quote(v.text)
                    ),
                ))
            }
        };
        l.no_more(3, USAGE)?;
        Ok(ThpDisable { proc, on })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.live(&self.proc).map(drop)
    }
}

impl fmt::Display for ThpDisable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = if self.on { "on" } else { "off" };
        write!(f, "{} thp_disable {on}", self.proc)
    }
}

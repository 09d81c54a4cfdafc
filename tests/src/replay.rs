//! Real firmware replay: the device model underneath, real firmware's
//! answers on top.
//!
//! [`Replay`] implements [`mlx5_emu::OutputOverride`]: the model executes
//! every command (so its pages, UARs, EQs and HCA state stay live, and event
//! mode works), then the driver gets what real firmware answered the same
//! command in a trace ([`mlx5_hw::trace`]), matched by opcode and op_mod.
//!
//! # Which answers come from the trace
//!
//! For `(opcode, op_mod)` the trace answered `n` times, the driver's `k`-th
//! command of that kind gets the trace's `k`-th answer; once the `n`
//! answers are used up, the last one is repeated (it is the newest state
//! real firmware showed: the driver queries the general caps three times,
//! the kernel twice, and the third query must see the caps after
//! SET_HCA_CAP/INIT_HCA, not wrap back to the boot-time ones).
//!
//! Per opcode ([`policy`]):
//!
//! - **whole from the trace**: ENABLE_HCA, QUERY_ISSI, SET_ISSI,
//!   QUERY_PAGES (so the driver gives real firmware's page counts),
//!   MANAGE_PAGES GIVE (its status), ACCESS_REG (only for the same
//!   `register_id`), QUERY_HCA_CAP, SET_HCA_CAP, INIT_HCA, QUERY_ADAPTER;
//! - **from the trace, the object id from the model**: ALLOC_UAR (`uar`),
//!   CREATE_EQ (`eq_number`): the driver must ring doorbells and match
//!   EQEs of objects the model knows; where the ids differ it is recorded as
//!   a [`Divergence`];
//! - **the model's answer**, recorded as [`Unanswered`]: everything the
//!   trace never answered (the trace ends at the kernel's CREATE_EQs: no
//!   MANAGE_PAGES TAKE, vport queries, DESTROY_EQ, DEALLOC_UAR,
//!   TEARDOWN_HCA, DISABLE_HCA), and opcodes replay deliberately leaves to
//!   the model (NOP; commands that name objects real firmware never had).
//!
//! Every answer taken from the trace is compared with the model's own
//! output for the same command; differences (status, page counts, fields of
//! capabilities and adapter data, ids) are recorded as [`Divergence`]s: the
//! places our model disagrees with real firmware.
//!
//! A command the model failed but the trace answered with success (or the
//! reverse) is also a divergence: the model's state then differs from what
//! the driver believes, and later commands will show it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use mlx5_hw::ifc::{access_register_in, alloc_uar_out, create_eq_out};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::registry;
use mlx5_hw::trace::TracedCommand;

/// How one opcode is replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The trace's output, whole.
    Whole,
    /// The trace's output with the model's object id (`uar`, `eq_number`).
    KeepModelId,
    /// Always the model's output (never replayed).
    Model,
}

/// The replay policy of `opcode` (see the module docs).
pub fn policy(opcode: u16) -> Policy {
    use Opcode as O;
    match Opcode::from(opcode) {
        O::EnableHca
        | O::QueryIssi
        | O::SetIssi
        | O::QueryPages
        | O::ManagePages
        | O::AccessReg
        | O::QueryHcaCap
        | O::SetHcaCap
        | O::InitHca
        | O::QueryAdapter => Policy::Whole,
        O::AllocUar | O::CreateEq => Policy::KeepModelId,
        _ => Policy::Model,
    }
}

/// Where the driver's answer to one command came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The trace's `index`-th (0-based) answer of `of` for this opcode and
    /// op_mod, at `line` of the trace (repeats reuse the last one).
    Trace {
        /// Which answer.
        index: usize,
        /// How many the trace has.
        of: usize,
        /// Line of the trace's INPUT dump.
        line: usize,
    },
    /// The model's own answer: the trace has none.
    Model,
}

/// One command the driver sent, as the replay answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// Opcode.
    pub opcode: u16,
    /// op_mod.
    pub op_mod: u16,
    /// Where the answer came from.
    pub source: Source,
    /// The status the driver got.
    pub status: u8,
}

/// A command the trace never answered: the driver got the model's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    /// Opcode.
    pub opcode: u16,
    /// op_mod.
    pub op_mod: u16,
    /// Why: nothing in the trace, or what kept it from matching.
    pub why: String,
    /// The model's status.
    pub model_status: u8,
}

impl Unanswered {
    /// The opcode's name (`DESTROY_EQ`).
    pub fn name(&self) -> &'static str {
        Opcode::from(self.opcode).name()
    }
}

impl fmt::Display for Unanswered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}({:#x}) op_mod {}: {} (model status {:#x})",
            self.name(),
            self.opcode,
            self.op_mod,
            self.why,
            self.model_status
        )
    }
}

/// What a [`Divergence`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The model's output against real firmware's (`model` is the model's
    /// value).
    Output,
    /// Our driver's input against the kernel's for the same command
    /// (`model` is our driver's value, `trace` the kernel's): an output
    /// difference that follows from it is the driver's choice, not the
    /// model's error.
    Input,
}

/// A place where the model's answer differs from real firmware's, or our
/// driver's input from the kernel's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// Output or input.
    pub kind: Kind,
    /// Opcode.
    pub opcode: u16,
    /// op_mod.
    pub op_mod: u16,
    /// What differs: a field path (`capability.log_max_qp`), `status`,
    /// `num_pages`, `uar`, `eq_number`, or `bytes 0x10..0x20`.
    pub what: String,
    /// Real firmware's value.
    pub trace: u64,
    /// The model's value.
    pub model: u64,
    /// What the driver got: true if the model's value was kept (object
    /// ids), false if the trace's went to the driver.
    pub model_kept: bool,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (t, m) = match self.kind {
            Kind::Output => ("real fw", "model"),
            Kind::Input => ("kernel sent", "our driver sent"),
        };
        write!(
            f,
            "{}({:#x}) op_mod {:#x}: {}: {t} {:#x}, {m} {:#x}{}",
            Opcode::from(self.opcode).name(),
            self.opcode,
            self.op_mod,
            self.what,
            self.trace,
            self.model,
            if self.kind == Kind::Input {
                ""
            } else if self.model_kept {
                " (model's kept)"
            } else {
                " (real fw's given)"
            }
        )
    }
}

#[derive(Debug, Default)]
struct State {
    used: BTreeMap<(u16, u16), usize>,
    log: Vec<Answered>,
    unanswered: Vec<Unanswered>,
    divergences: Vec<Divergence>,
}

/// The replay: real firmware's recorded outputs by (opcode, op_mod).
#[derive(Debug)]
pub struct Replay {
    answers: BTreeMap<(u16, u16), Vec<TracedCommand>>,
    state: Mutex<State>,
}

impl Replay {
    /// A replay of `trace`'s answers.
    pub fn new(trace: &[TracedCommand]) -> Self {
        let mut answers: BTreeMap<(u16, u16), Vec<TracedCommand>> = BTreeMap::new();
        for c in trace {
            answers
                .entry((c.opcode, c.op_mod))
                .or_default()
                .push(c.clone());
        }
        Self {
            answers,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many answers the trace has for `opcode`, `op_mod`.
    pub fn recorded(&self, opcode: u16, op_mod: u16) -> usize {
        self.answers.get(&(opcode, op_mod)).map_or(0, Vec::len)
    }

    /// Every command answered so far, in order.
    pub fn log(&self) -> Vec<Answered> {
        self.state().log.clone()
    }

    /// The commands the trace had no answer for, in order.
    pub fn unanswered(&self) -> Vec<Unanswered> {
        self.state().unanswered.clone()
    }

    /// The distinct opcode names of [`Replay::unanswered`], in first-seen
    /// order.
    pub fn unanswered_names(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = Vec::new();
        for u in self.state().unanswered.iter() {
            if !v.contains(&u.name()) {
                v.push(u.name());
            }
        }
        v
    }

    /// Where the model's answers differed from real firmware's.
    pub fn divergences(&self) -> Vec<Divergence> {
        self.state().divergences.clone()
    }

    /// A readable report: each command and its source, the unanswered
    /// commands, the divergences.
    pub fn report(&self) -> String {
        use fmt::Write as _;
        let s = self.state();
        let mut r = String::new();
        let _ = writeln!(r, "commands the driver sent ({}):", s.log.len());
        for a in &s.log {
            let src = match &a.source {
                Source::Trace { index, of, line } => {
                    format!("trace answer {}/{} (line {line})", index + 1, of)
                }
                Source::Model => "MODEL (not in the trace)".to_string(),
            };
            let _ = writeln!(
                r,
                "  {:<28} op_mod {:#06x} status {:#04x}  {src}",
                Opcode::from(a.opcode).name(),
                a.op_mod,
                a.status
            );
        }
        let _ = writeln!(
            r,
            "commands real firmware never answered in the trace ({}):",
            s.unanswered.len()
        );
        for u in &s.unanswered {
            let _ = writeln!(r, "  {u}");
        }
        let _ = writeln!(
            r,
            "divergences model vs real firmware ({}):",
            s.divergences.len()
        );
        for d in &s.divergences {
            let _ = writeln!(r, "  {d}");
        }
        r
    }

    fn diverge(
        st: &mut State,
        opcode: u16,
        op_mod: u16,
        what: impl Into<String>,
        trace: u64,
        model: u64,
        model_kept: bool,
    ) {
        st.divergences.push(Divergence {
            kind: Kind::Output,
            opcode,
            op_mod,
            what: what.into(),
            trace,
            model,
            model_kept,
        });
    }

    /// Records field by field where `model` differs from `trace` (both
    /// whole outputs), through the registry layout of the opcode's output
    /// if there is one, else by 16-byte rows.
    fn compare(st: &mut State, kind: Kind, opcode: u16, op_mod: u16, trace: &[u8], model: &[u8]) {
        let n = trace.len().max(model.len());
        let pad = |b: &[u8]| {
            let mut v = b.to_vec();
            v.resize(n, 0);
            v
        };
        let (t, m) = (pad(trace), pad(model));
        if t == m {
            return;
        }
        // The status first, on its own: it says the model's state moved
        // differently from real firmware's.
        if kind == Kind::Output && t[0] != m[0] {
            Self::diverge(
                st,
                opcode,
                op_mod,
                "status",
                t[0].into(),
                m[0].into(),
                false,
            );
            return; // the rest of a failed output means nothing
        }
        let first = st.divergences.len();
        let layout = layout_of(kind, opcode);
        if let Some(info) = layout {
            let ft = registry::decode(info, &t);
            let fm = registry::decode(info, &m);
            let mut any = false;
            for (a, b) in ft.iter().zip(fm.iter()) {
                if a.path.contains("reserved") || !in_cap_member(&a.path, op_mod) {
                    continue;
                }
                if a.value != b.value || a.bytes != b.bytes {
                    any = true;
                    Self::diverge(
                        st,
                        opcode,
                        op_mod,
                        a.path.clone(),
                        a.value.unwrap_or(u64::MAX),
                        b.value.unwrap_or(u64::MAX),
                        false,
                    );
                }
            }
            if any {
                for d in &mut st.divergences[first..] {
                    d.kind = kind;
                }
                return;
            }
        }
        // No layout (or only reserved bits differ): by rows.
        for row in (0..n).step_by(16) {
            let end = (row + 16).min(n);
            if t[row..end] != m[row..end] {
                let w = |b: &[u8]| {
                    b[row..(row + 8).min(end)]
                        .iter()
                        .fold(0u64, |a, x| a << 8 | u64::from(*x))
                };
                Self::diverge(
                    st,
                    opcode,
                    op_mod,
                    format!(
                        "bytes {row:#x}..{end:#x}{}",
                        if layout.is_some() { " (reserved)" } else { "" }
                    ),
                    w(&t),
                    w(&m),
                    false,
                );
            }
        }
        for d in &mut st.divergences[first..] {
            d.kind = kind;
        }
    }
}

/// The registry layout of `opcode`'s output (or input, for
/// [`Kind::Input`]), for field-level diffs.
fn layout_of(kind: Kind, opcode: u16) -> Option<&'static registry::LayoutInfo> {
    use Opcode as O;
    let name = match (kind, Opcode::from(opcode)) {
        (Kind::Output, O::QueryHcaCap) => "query_hca_cap_out",
        (Kind::Output, O::QueryAdapter) => "query_adapter_out",
        (Kind::Output, O::QueryIssi) => "query_issi_out",
        (Kind::Output, O::QueryPages) => "query_pages_out",
        (Kind::Input, O::SetHcaCap) => "set_hca_cap_in",
        _ => return None,
    };
    registry::layout(name)
}

/// Capability pages decode as a union of every cap type: keep the member
/// of the type `op_mod` names (`op_mod >> 1`), and all non-union fields.
fn in_cap_member(path: &str, op_mod: u16) -> bool {
    let Some(rest) = path.strip_prefix("capability.") else {
        return true;
    };
    let member = match op_mod >> 1 {
        0x0 => "cmd_hca_cap.",
        0x2 => "odp_cap.",
        0x3 => "atomic_caps.",
        0x4 => "roce_cap.",
        0xf => "device_mem_cap.",
        0x20 => "cmd_hca_cap_2.",
        _ => return false,
    };
    rest.starts_with(member)
}

impl mlx5_emu::OutputOverride for Replay {
    fn answer(
        &self,
        opcode: u16,
        op_mod: u16,
        input: &[u8],
        model_output: &[u8],
    ) -> Option<Vec<u8>> {
        let mut st = self.state();
        let model_status = model_output.first().copied().unwrap_or(0);
        let pol = policy(opcode);
        let recorded = self.answers.get(&(opcode, op_mod));
        let why = match (pol, recorded) {
            (Policy::Model, _) => Some("left to the model".to_string()),
            (_, None) => Some(if self.answers.keys().any(|k| k.0 == opcode) {
                "the trace has this opcode only with other op_mods".to_string()
            } else {
                "the trace never sent it".to_string()
            }),
            _ => None,
        };
        let (recorded, why) = match (recorded, why) {
            (Some(r), None) => (r, None),
            (_, why) => (&Vec::new(), why),
        };
        // ACCESS_REG answers only the register the trace accessed.
        let k = st.used.get(&(opcode, op_mod)).copied().unwrap_or(0);
        let pick = recorded.get(k.min(recorded.len().saturating_sub(1)));
        let why = why.or_else(|| {
            let t = pick?;
            (Opcode::from(opcode) == Opcode::AccessReg
                && input.len() >= access_register_in::SIZE_BYTES
                && t.input.len() >= access_register_in::SIZE_BYTES
                && access_register_in::REGISTER_ID.get(input)
                    != access_register_in::REGISTER_ID.get(&t.input))
            .then(|| {
                format!(
                    "register {:#x}: the trace accessed only {:#x}",
                    access_register_in::REGISTER_ID.get(input),
                    access_register_in::REGISTER_ID.get(&t.input)
                )
            })
        });
        let (Some(t), None) = (pick, why.clone()) else {
            st.unanswered.push(Unanswered {
                opcode,
                op_mod,
                why: why.unwrap_or_default(),
                model_status,
            });
            st.log.push(Answered {
                opcode,
                op_mod,
                source: Source::Model,
                status: model_status,
            });
            return None;
        };
        st.used.insert((opcode, op_mod), k + 1);
        let mut out = t.output.clone();
        if pol == Policy::KeepModelId && model_status == 0 && out.first() == Some(&0) {
            let field = match Opcode::from(opcode) {
                Opcode::AllocUar => Some(("uar", alloc_uar_out::UAR)),
                Opcode::CreateEq => Some(("eq_number", create_eq_out::EQ_NUMBER)),
                _ => None,
            };
            if let Some((name, f)) = field {
                if out.len() >= 0x10 && model_output.len() >= 0x10 {
                    let (tv, mv) = (f.get(&out), f.get(model_output));
                    if tv != mv {
                        Self::diverge(&mut st, opcode, op_mod, name, tv, mv, true);
                        f.set(&mut out, mv);
                    }
                }
            }
        }
        if Opcode::from(opcode) == Opcode::SetHcaCap {
            Self::compare(&mut st, Kind::Input, opcode, op_mod, &t.input, input);
        }
        Self::compare(&mut st, Kind::Output, opcode, op_mod, &out, model_output);
        let status = out.first().copied().unwrap_or(0);
        st.log.push(Answered {
            opcode,
            op_mod,
            source: Source::Trace {
                index: k.min(recorded.len() - 1),
                of: recorded.len(),
                line: t.line,
            },
            status,
        });
        Some(out)
    }
}

//! Semantic validation of a decoded bundle: every index the VM follows is in range.
//!
//! [`decode`](super::decode) runs this on every bundle it returns, so the machine may
//! index the step, template, message and code tables without bounds checks failing.
//! What is deliberately not checked: that template kinds match the instructions that
//! render them, that source spans lie inside the source, or that the step graph's edges
//! agree with the templates. A bundle that gets those wrong misbehaves, but cannot make
//! the VM panic.

use std::collections::HashMap;

use super::{Bundle, BundleError, EdgeTarget, Instr, StepId};

impl Bundle {
    /// Checks that every table index in the bundle is in range and that the code is a
    /// sequence of well-formed steps; see `spec/bundle-format.md` for the rules.
    ///
    /// On failure the [`BundleError::Invalid`] message names the offending entry.
    pub fn validate(&self) -> Result<(), BundleError> {
        self.validate_step_table()?;
        self.validate_step_code()?;
        self.validate_operands()?;
        self.validate_messages()?;
        self.validate_templates()?;
        self.validate_edges()
    }

    /// At least one step, addressable by a `StepId`, with non-empty unique names.
    fn validate_step_table(&self) -> Result<(), BundleError> {
        if self.steps.is_empty() {
            return Err(invalid(
                "the step table is empty (a bundle needs at least one step)".to_owned(),
            ));
        }
        if u32::try_from(self.steps.len()).is_err() {
            return Err(invalid(format!(
                "the step table has {} entries, more than a StepId can address",
                self.steps.len()
            )));
        }
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate() {
            if step.name.is_empty() {
                return Err(invalid(format!("step {i} has an empty name")));
            }
            if let Some(first) = seen.insert(&step.name, i) {
                return Err(invalid(format!(
                    "step {i} has the same name `{}` as step {first}",
                    step.name
                )));
            }
        }
        Ok(())
    }

    /// The span side table matches the code, and the steps tile the code exactly, in
    /// order: each step's instructions run from its entry to the next step's entry,
    /// start with its own `EnterStep`, end with `Branch`, and contain neither elsewhere.
    fn validate_step_code(&self) -> Result<(), BundleError> {
        let code = &self.code;
        if self.code_spans.len() != code.len() {
            return Err(invalid(format!(
                "the span table has {} entries but the code has {} instructions",
                self.code_spans.len(),
                code.len()
            )));
        }
        let mut previous: Option<usize> = None;
        for (i, step) in self.steps.iter().enumerate() {
            let entry = step.entry as usize;
            match previous {
                None if entry != 0 => {
                    return Err(invalid(format!(
                        "step {i} starts at instruction {entry}, expected 0"
                    )));
                }
                Some(prev) if entry <= prev => {
                    return Err(invalid(format!(
                        "step {i} starts at instruction {entry}, not after step {} (at {prev}): \
                         steps must be in entry order",
                        i - 1
                    )));
                }
                _ => {}
            }
            if entry >= code.len() {
                return Err(invalid(format!(
                    "step {i} starts at instruction {entry}, but the code has only {} \
                     instructions",
                    code.len()
                )));
            }
            previous = Some(entry);
        }

        // The loop above established 0 = entry_0 < entry_1 < … < code.len(), so every
        // segment below is non-empty and in bounds.
        let ends = self
            .steps
            .iter()
            .skip(1)
            .map(|step| step.entry as usize)
            .chain([code.len()]);
        for ((i, step), end) in self.steps.iter().enumerate().zip(ends) {
            let start = step.entry as usize;
            // `validate_step_table` checked that every step index fits a u32.
            let own = Instr::EnterStep(StepId(i as u32));
            let (first, last) = (code[start], code[end - 1]);
            if first != own {
                return Err(invalid(format!(
                    "instruction {start}, the entry of step {i}, is {first:?}, expected {own:?}"
                )));
            }
            if last != Instr::Branch {
                return Err(invalid(format!(
                    "instruction {}, the last of step {i}, is {last:?}, expected Branch",
                    end - 1
                )));
            }
            for (j, instr) in code.iter().enumerate().take(end - 1).skip(start + 1) {
                match instr {
                    Instr::Branch => {
                        return Err(invalid(format!(
                            "instruction {j} in step {i} is a Branch; only the last \
                             instruction of a step may be"
                        )));
                    }
                    Instr::EnterStep(_) => {
                        return Err(invalid(format!(
                            "instruction {j} in step {i} is an {instr:?}; only the first \
                             instruction of a step may be"
                        )));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Template ids and message ranges named by instructions are in range. (`EnterStep`
    /// ids were checked by [`Bundle::validate_step_code`]: each one is its own step's.)
    fn validate_operands(&self) -> Result<(), BundleError> {
        for (j, instr) in self.code.iter().enumerate() {
            match *instr {
                Instr::RenderPre(template) | Instr::RenderPost(template) => {
                    if template.index() >= self.templates.len() {
                        let name = if matches!(instr, Instr::RenderPre(_)) {
                            "RenderPre"
                        } else {
                            "RenderPost"
                        };
                        return Err(invalid(format!(
                            "instruction {j} ({name}) refers to template {}, but there are \
                             only {} templates",
                            template.0,
                            self.templates.len()
                        )));
                    }
                }
                Instr::BuildPrompts { first, count } => {
                    let Some(end) = first.checked_add(count) else {
                        return Err(invalid(format!(
                            "instruction {j} (BuildPrompts) covers messages {first} + {count}, \
                             which overflows a u32"
                        )));
                    };
                    if end as usize > self.messages.len() {
                        return Err(invalid(format!(
                            "instruction {j} (BuildPrompts) covers messages {first}..{end}, \
                             but there are only {} messages",
                            self.messages.len()
                        )));
                    }
                }
                Instr::EnterStep(_)
                | Instr::CallProvider
                | Instr::ProcessResponse
                | Instr::CallTools
                | Instr::ClearNextStep
                | Instr::Snapshot
                | Instr::Branch => {}
            }
        }
        Ok(())
    }

    /// Every message renders an existing template.
    fn validate_messages(&self) -> Result<(), BundleError> {
        for (k, message) in self.messages.iter().enumerate() {
            if message.template.index() >= self.templates.len() {
                return Err(invalid(format!(
                    "message {k} refers to template {}, but there are only {} templates",
                    message.template.0,
                    self.templates.len()
                )));
            }
        }
        Ok(())
    }

    /// Every template belongs to an existing step.
    fn validate_templates(&self) -> Result<(), BundleError> {
        for (k, template) in self.templates.iter().enumerate() {
            if template.step.index() >= self.steps.len() {
                return Err(invalid(format!(
                    "template {k} belongs to step {}, but there are only {} steps",
                    template.step.0,
                    self.steps.len()
                )));
            }
        }
        Ok(())
    }

    /// Every edge starts at, and (when static) goes to, an existing step.
    fn validate_edges(&self) -> Result<(), BundleError> {
        for (k, edge) in self.edges.iter().enumerate() {
            if edge.from.index() >= self.steps.len() {
                return Err(invalid(format!(
                    "edge {k} starts at step {}, but there are only {} steps",
                    edge.from.0,
                    self.steps.len()
                )));
            }
            match edge.to {
                EdgeTarget::Step(to) if to.index() >= self.steps.len() => {
                    return Err(invalid(format!(
                        "edge {k} goes to step {}, but there are only {} steps",
                        to.0,
                        self.steps.len()
                    )));
                }
                EdgeTarget::Step(_) | EdgeTarget::Return | EdgeTarget::Dynamic => {}
            }
        }
        Ok(())
    }
}

#[cold]
fn invalid(message: String) -> BundleError {
    BundleError::Invalid(message)
}

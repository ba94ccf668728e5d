//! Property tests: `bundle::decode` on untrusted bytes never panics, and whatever it
//! accepts passes `Bundle::validate`; `Program::from_bundle` on bundles with hostile
//! templates (deep expressions, `include` and friends, non-ASCII) never panics nor
//! overflows the stack (issue #9, F2, F21).
//!
//! Case counts are kept modest so the suite runs in seconds in a debug build.

use aplc_vm::bundle::{
    Bundle, BundleError, Edge, EdgeTarget, FORMAT_VERSION, Instr, MAGIC, MessageEntry, Role,
    SourceSpan, StepEntry, StepId, TemplateEntry, TemplateId, TemplateKind, decode, encode,
};
use aplc_vm::{Limits, LoadError, Program, check_template};
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

const HEADER_LEN: usize = 24;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        // Random bytes essentially never carry the magic.
        prop_assert_eq!(decode(&bytes).err(), Some(BundleError::BadMagic));
    }

    #[test]
    fn bytes_after_the_magic_never_panic(rest in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&rest);
        prop_assert!(decode(&bytes).is_err());
    }

    #[test]
    fn random_payload_behind_a_valid_header_never_panics(
        payload in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        if let Ok(bundle) = decode(&with_header(&payload)) {
            prop_assert_eq!(bundle.validate(), Ok(()));
        }
    }

    #[test]
    fn valid_bundles_round_trip(bundle in valid_bundle()) {
        prop_assert_eq!(bundle.validate(), Ok(()));
        prop_assert_eq!(decode(&encode(&bundle).expect("encodes")), Ok(bundle));
    }

    #[test]
    fn mutating_one_byte_never_panics_nor_yields_an_invalid_bundle(
        bundle in valid_bundle(),
        index in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = encode(&bundle).expect("encodes");
        let at = index.index(bytes.len());
        bytes[at] = byte;
        if let Ok(decoded) = decode(&bytes) {
            prop_assert_eq!(decoded.validate(), Ok(()));
        }
    }

    /// Like the test above, but with the checksum fixed up, so the mutation reaches
    /// postcard and `validate` instead of stopping at the checksum.
    #[test]
    fn mutating_one_payload_byte_past_the_checksum_never_yields_an_invalid_bundle(
        bundle in valid_bundle(),
        index in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut payload = encode(&bundle).expect("encodes").split_off(HEADER_LEN);
        let at = index.index(payload.len());
        payload[at] = byte;
        if let Ok(decoded) = decode(&with_header(&payload)) {
            prop_assert_eq!(decoded.validate(), Ok(()));
        }
    }

    /// A bundle's templates are checked before minijinja parses them: loading never
    /// overflows a 2 MiB stack, and a template that loads passed every check.
    #[test]
    fn hostile_templates_never_crash_the_loader(
        bundle in valid_bundle(),
        sources in prop::collection::vec(hostile_template(), 1..4),
    ) {
        let mut bundle = bundle;
        for (t, source) in bundle.templates.iter_mut().zip(sources.iter().cycle()) {
            t.source = source.clone();
        }
        // A test thread with tokio's worker stack size; the crate itself spawns none.
        #[allow(clippy::disallowed_methods)]
        let worker = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let checks: Vec<_> = bundle.templates.iter().map(|t| check_template(&t.source)).collect();
                match Program::from_bundle(bundle, Limits::default()) {
                    Ok(_) => assert!(checks.iter().all(Result::is_ok)),
                    Err(LoadError::Template { index, .. }) => assert!(index < checks.len()),
                    Err(other) => panic!("unexpected load error: {other}"),
                }
            })
            .expect("spawn a 2 MiB thread");
        prop_assert!(worker.join().is_ok());
    }

    #[test]
    fn truncating_never_panics_and_always_fails(
        bundle in valid_bundle(),
        index in any::<prop::sample::Index>(),
    ) {
        let bytes = encode(&bundle).expect("encodes");
        let len = index.index(bytes.len());
        prop_assert!(decode(&bytes[..len]).is_err());
    }
}

/// Templates an attacker might put in a bundle: long operator chains, deep brackets,
/// statements that pull in other templates, non-ASCII, all mixed with random pieces.
fn hostile_template() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        (1usize..60_000).prop_map(|n| format!("{{{{ 1{} }}}}", "+1".repeat(n))),
        (1usize..60_000).prop_map(|n| format!("{{{{ {}x }}}}", "not ".repeat(n))),
        (1usize..60_000).prop_map(|n| format!("{{{{ x{} }}}}", ".a".repeat(n))),
        (1usize..60_000).prop_map(|n| format!("{{{{ x{} }}}}", "|e".repeat(n))),
        (1usize..400).prop_map(|n| format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n))),
        (1usize..400).prop_map(|n| format!(
            "{}x{}",
            "{% if x %}".repeat(n),
            "{% endif %}".repeat(n)
        )),
        Just("{% include '0' %}".to_string()),
        Just("{% import '0' as m %}{{ m }}".to_string()),
        Just("{% from '0' import x %}".to_string()),
        Just("{% extends '0' %}".to_string()),
        Just("{% block b %}x{% endblock %}".to_string()),
        Just("{% macro m() %}{{ caller() }}{% endmacro %}".to_string()),
        Just("{{ café }}".to_string()),
        Just("{{ x\u{a0}}}".to_string()),
        "[{}%#a-z|.()+ ]{0,24}",
        "\\PC{0,12}",
    ];
    prop::collection::vec(piece, 1..4).prop_map(|p| p.concat())
}

/// Wraps `payload` in a version-1 header with a correct length and checksum.
fn with_header(payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// Bundles that pass `validate`: 1 to 3 steps of random straight-line code over small
/// template and message tables.
fn valid_bundle() -> impl Strategy<Value = Bundle> {
    (1usize..4, 1usize..6, 0usize..5).prop_flat_map(|(steps, templates, messages)| {
        let step_bodies = prop::collection::vec(
            prop::collection::vec(body_instr(templates as u32, messages as u32), 0..8),
            steps,
        );
        let template_table = prop::collection::vec(
            (
                "[a-z {}]{0,12}",
                0..steps as u32,
                prop_oneof![
                    Just(TemplateKind::Pre),
                    prop::sample::select(Role::ALL.to_vec()).prop_map(TemplateKind::Prompt),
                    Just(TemplateKind::Post),
                ],
            ),
            templates,
        );
        let message_table = prop::collection::vec(
            (
                prop::sample::select(Role::ALL.to_vec()),
                0..templates as u32,
            ),
            messages,
        );
        let edges = prop::collection::vec(
            (
                0..steps as u32,
                prop_oneof![
                    (0..steps as u32).prop_map(|to| EdgeTarget::Step(StepId(to))),
                    Just(EdgeTarget::Return),
                    Just(EdgeTarget::Dynamic),
                ],
            ),
            0..4,
        );
        (step_bodies, template_table, message_table, edges).prop_map(
            |(bodies, templates, messages, edges)| build_bundle(bodies, templates, messages, edges),
        )
    })
}

/// An instruction that may appear between a step's `EnterStep` and its `Branch`.
fn body_instr(templates: u32, messages: u32) -> impl Strategy<Value = Instr> {
    prop_oneof![
        (0..templates).prop_map(|t| Instr::RenderPre(TemplateId(t))),
        (0..templates).prop_map(|t| Instr::RenderPost(TemplateId(t))),
        (0..=messages)
            .prop_flat_map(move |first| (Just(first), 0..=messages - first))
            .prop_map(|(first, count)| Instr::BuildPrompts { first, count }),
        Just(Instr::CallProvider),
        Just(Instr::ProcessResponse),
        Just(Instr::CallTools),
        Just(Instr::ClearNextStep),
        Just(Instr::Snapshot),
    ]
}

fn build_bundle(
    bodies: Vec<Vec<Instr>>,
    templates: Vec<(String, u32, TemplateKind)>,
    messages: Vec<(Role, u32)>,
    edges: Vec<(u32, EdgeTarget)>,
) -> Bundle {
    let span = |n: usize| SourceSpan {
        start: n as u32,
        end: n as u32 + 1,
        line: n as u32 + 1,
        col: 1,
    };
    let mut steps = Vec::new();
    let mut code = Vec::new();
    for (i, body) in bodies.into_iter().enumerate() {
        steps.push(StepEntry {
            name: format!("step{i}"),
            entry: code.len() as u32,
            span: span(i),
        });
        code.push(Instr::EnterStep(StepId(i as u32)));
        code.extend(body);
        code.push(Instr::Branch);
    }
    Bundle {
        compiler_version: "0.1.0".to_owned(),
        source_name: "prop.apl".to_owned(),
        source_hash: [0xab; 32],
        inputs: Vec::new(),
        steps,
        templates: templates
            .into_iter()
            .enumerate()
            .map(|(k, (source, step, kind))| TemplateEntry {
                source,
                step: StepId(step),
                kind,
                span: span(k),
            })
            .collect(),
        messages: messages
            .into_iter()
            .map(|(role, template)| MessageEntry {
                role,
                template: TemplateId(template),
            })
            .collect(),
        code_spans: (0..code.len()).map(span).collect(),
        code,
        edges: edges
            .into_iter()
            .enumerate()
            .map(|(k, (from, to))| Edge {
                from: StepId(from),
                to,
                span: span(k),
            })
            .collect(),
        dialect: Default::default(),
        description: None,
        agents: Vec::new(),
    }
}

//! Host Beaver dealing under memcheck: `proto::deal` for every matrix,
//! row-product and square step of a tiny generated model's plan, with the
//! dealer's seeds secret. The sections it emits (seeds, P1's `C_1`) are
//! secret too and are dropped unread; host's own tests check their algebra.

use suffuse_core::batch::BatchEval;
use suffuse_host::exec::Store;
use suffuse_host::model::{Config, Model};
use suffuse_host::plan::{Kind, bert};
use suffuse_host::proto;

use super::{HarnessResult, PublicInputs, memcheck};

/// Triple steps dealt, and the section bytes they produced.
pub fn run(fss: &dyn BatchEval, inputs: &mut PublicInputs) -> HarnessResult<(usize, usize)> {
    let mut config = Config::demo();
    config.hidden = 8;
    config.heads = 2;
    config.intermediate = 16;
    config.layers = 1;
    let model = Model::generated(config, 3);
    let plan = bert::build(&model, 1, 3)?;
    let (mut steps, mut bytes) = (0, 0);
    // An encoder's plan opens no tensor ahead of its products.
    let opened = Store::new(&plan);
    for (op, o) in plan.ops.iter().enumerate() {
        if !matches!(o.kind, Kind::MatMul(_) | Kind::MulRows(_) | Kind::Square(_)) {
            continue;
        }
        let mut seeds = [inputs.block().to_bytes(), inputs.block().to_bytes()];
        memcheck::mark_secret(&mut seeds);
        proto::deal(
            &plan,
            op,
            fss,
            seeds,
            &opened,
            &mut |dealt: proto::Dealt| {
                bytes += dealt.len(0) + dealt.len(1);
                Ok(())
            },
        )?;
        steps += 1;
    }
    Ok((steps, bytes))
}

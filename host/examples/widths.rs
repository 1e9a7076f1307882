use suffuse_host::model::Model;
use suffuse_host::plan::bert;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let m = Model::load(std::path::Path::new(&args[1])).unwrap();
    let seq: usize = args[2].parse().unwrap();
    let p = bert::build(&m, 1, seq).unwrap();
    for (n, k) in p.widths() {
        if n.starts_with("layer 0") || n.starts_with("layer 5") {
            println!("{k:3} {n}");
        }
    }
    for t in &p.tensors {
        if t.name.starts_with("layer 0") {
            println!(
                "{:50} scale {:2} bound {:.3e}",
                t.name,
                t.scale,
                t.bound.max_abs()
            );
        }
    }
}

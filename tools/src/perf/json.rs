//! `--out_json`: perftest's JSON file (`write_test_info_to_file` and the
//! `REPORT_FMT*_JSON` results) — `test_info` with the header's keys and
//! `results` with `MsgSize`, `n_iterations`, `BW_peak`, `BW_average`,
//! `MsgRate` or `t_min` ... `percentile_99.9`. A sweep (`-a`) gives
//! `results` as an array, one object per size.

use serde_json::{json, Map, Value};

use super::bw::BwReport;
use super::lat::LatReport;
use super::params::{Kind, Params, Verb};

fn r2(x: f64) -> Value {
    json!((x * 100.0).round() / 100.0)
}

fn r6(x: f64) -> Value {
    json!((x * 1e6).round() / 1e6)
}

/// `test_info`.
pub fn test_info(p: &Params, dev: &str, client: bool, mtu_bytes: u32) -> Value {
    let f = &p.flags;
    let mut m = Map::new();
    m.insert(
        "test".into(),
        json!(super::report::title(p).replace(' ', "_")),
    );
    m.insert("Dual_port".into(), json!("OFF"));
    m.insert("Device".into(), json!(dev));
    m.insert("Number_of_qps".into(), json!(f.qps));
    m.insert("Transport_type".into(), json!("IB"));
    m.insert("Connection_type".into(), json!(f.conn.name()));
    m.insert("Using_SRQ".into(), json!("OFF"));
    m.insert("PCIe_relax_order".into(), json!("Unsupported"));
    m.insert("ibv_wr_API".into(), json!("OFF"));
    if client || f.bidirectional {
        m.insert("TX_depth".into(), json!(p.tx_depth));
    }
    if f.post_list > 1 {
        m.insert("Post_List".into(), json!(f.post_list));
    }
    if p.test.verb.has_recv() && (!client || f.bidirectional) {
        m.insert("RX_depth".into(), json!(p.rx_depth));
    }
    if p.test.kind == Kind::Bw {
        m.insert("CQ_Moderation".into(), json!(p.cq_mod));
    }
    m.insert("Mtu".into(), json!(mtu_bytes));
    m.insert("Link_type".into(), json!("Ethernet"));
    if f.gid_index.is_some() {
        m.insert("GID_index".into(), json!(p.gid_index));
    }
    if matches!(p.test.verb, Verb::Read | Verb::Atomic) {
        m.insert("Outstand_reads".into(), json!(p.outs));
    } else {
        m.insert("Max_inline_data".into(), json!(p.inline_size));
    }
    m.insert("rdma_cm_QPs".into(), json!("OFF"));
    m.insert("Data_ex_method".into(), json!("Ethernet"));
    Value::Object(m)
}

/// One bandwidth result.
pub fn bw(r: &BwReport, cpu: Option<f64>) -> Value {
    let mut m = Map::new();
    m.insert("MsgSize".into(), json!(r.size));
    m.insert("n_iterations".into(), json!(r.iters));
    m.insert("BW_peak".into(), r2(r.peak));
    m.insert("BW_average".into(), r2(r.avg));
    m.insert("MsgRate".into(), r6(r.msg_rate));
    if let Some(c) = cpu {
        m.insert("CPU_util".into(), r2(c));
    }
    Value::Object(m)
}

/// One latency result.
pub fn lat(r: &LatReport, cpu: Option<f64>) -> Value {
    let mut m = Map::new();
    m.insert("MsgSize".into(), json!(r.size));
    m.insert("n_iterations".into(), json!(r.iters));
    if let Some(tps) = r.tps {
        m.insert("t_avg".into(), r2(r.t_avg));
        m.insert("tps_average".into(), r2(tps));
    } else {
        m.insert("t_min".into(), r2(r.t_min));
        m.insert("t_max".into(), r2(r.t_max));
        m.insert("t_typical".into(), r2(r.t_typical));
        m.insert("t_avg".into(), r2(r.t_avg));
        m.insert("t_stdev".into(), r2(r.t_stdev));
        m.insert("percentile_99".into(), r2(r.p99));
        m.insert("percentile_99.9".into(), r2(r.p999));
    }
    if let Some(c) = cpu {
        m.insert("CPU_util".into(), r2(c));
    }
    Value::Object(m)
}

/// The whole file.
pub fn document(info: Value, mut results: Vec<Value>) -> Value {
    let results = if results.len() == 1 {
        results.remove(0)
    } else {
        Value::Array(results)
    };
    json!({ "test_info": info, "results": results })
}

//! Which provider serves a device, and the logging switch.

/// Who serves a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// This provider (`libmlx5rs`).
    Ours,
    /// rdma-core's libmlx5 (ours declines the device).
    Libmlx5,
}

/// The choice for device `ibdev` (e.g. `mlx5_0`): `MLX5RS_PROVIDER_<ibdev>` if set, else
/// `MLX5RS_PROVIDER`, else ours. A value other than `ours` or `libmlx5` is an error naming
/// the variable and the value.
pub fn choice_for(ibdev: &str, get: impl Fn(&str) -> Option<String>) -> Result<Choice, String> {
    let per_device = format!("MLX5RS_PROVIDER_{ibdev}");
    let (var, value) = match get(&per_device) {
        Some(v) => (per_device, v),
        None => match get("MLX5RS_PROVIDER") {
            Some(v) => ("MLX5RS_PROVIDER".to_owned(), v),
            None => return Ok(Choice::Ours),
        },
    };
    match value.as_str() {
        "ours" | "libmlx5rs" => Ok(Choice::Ours),
        "libmlx5" => Ok(Choice::Libmlx5),
        other => Err(format!(
            "{var}={other:?} is neither \"ours\" nor \"libmlx5\""
        )),
    }
}

/// `MLX5RS_LOG=1`: one stderr line per opened device (and the reason for every refusal).
pub(crate) fn log_enabled() -> bool {
    std::env::var_os("MLX5RS_LOG").is_some_and(|v| v != "0" && !v.is_empty())
}

/// `MLX5_SINGLE_THREADED=1` (libmlx5's variable): no locks on the QP, SRQ and CQ paths.
pub(crate) fn single_threaded() -> bool {
    std::env::var("MLX5_SINGLE_THREADED")
        .is_ok_and(|v| v.trim().parse::<i64>().is_ok_and(|n| n != 0))
}

/// libmlx5's BlueFlame knobs, read the same way: `MLX5_SHUT_UP_BF` set and not `0` -> never
/// BlueFlame; else `MLX5_POST_SEND_PREFER_BF` unset or not `0` -> BlueFlame for every
/// single-WQE doorbell that fits (libmlx5's default), `0` -> only for inline WQEs.
pub fn bf_policy(get: impl Fn(&str) -> Option<String>) -> mlx5::BfPolicy {
    let on = |v: Option<String>| v.is_some_and(|v| v != "0");
    if on(get("MLX5_SHUT_UP_BF")) {
        mlx5::BfPolicy::AlwaysDoorbell
    } else if get("MLX5_POST_SEND_PREFER_BF").is_none_or(|v| v != "0") {
        mlx5::BfPolicy::PreferBf
    } else {
        mlx5::BfPolicy::InlineOnly
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn per_device_wins_over_process_wide() {
        let e = [
            ("MLX5RS_PROVIDER", "libmlx5"),
            ("MLX5RS_PROVIDER_mlx5_1", "ours"),
        ];
        assert_eq!(choice_for("mlx5_0", env(&e)), Ok(Choice::Libmlx5));
        assert_eq!(choice_for("mlx5_1", env(&e)), Ok(Choice::Ours));
        assert_eq!(choice_for("mlx5_0", env(&[])), Ok(Choice::Ours));
    }

    #[test]
    fn bf_knobs_read_as_libmlx5_reads_them() {
        use mlx5::BfPolicy as B;
        assert_eq!(bf_policy(env(&[])), B::PreferBf);
        assert_eq!(
            bf_policy(env(&[("MLX5_POST_SEND_PREFER_BF", "1")])),
            B::PreferBf
        );
        assert_eq!(
            bf_policy(env(&[("MLX5_POST_SEND_PREFER_BF", "0")])),
            B::InlineOnly
        );
        assert_eq!(bf_policy(env(&[("MLX5_SHUT_UP_BF", "0")])), B::PreferBf);
        assert_eq!(
            bf_policy(env(&[
                ("MLX5_SHUT_UP_BF", "1"),
                ("MLX5_POST_SEND_PREFER_BF", "0")
            ])),
            B::AlwaysDoorbell
        );
    }

    #[test]
    fn a_bad_value_is_named() {
        let e = [("MLX5RS_PROVIDER_mlx5_0", "theirs")];
        let err = choice_for("mlx5_0", env(&e)).unwrap_err();
        assert!(
            err.contains("MLX5RS_PROVIDER_mlx5_0") && err.contains("theirs"),
            "{err}"
        );
    }
}

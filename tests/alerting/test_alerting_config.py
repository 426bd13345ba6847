"""The alerting examples agree with one another (fast, no binary needed): compose's overlay runs what deploy/alerting/
configures -- the one tests/alerting/test_alert_channel.py runs for real -- and every rule is scaled by that test on
purpose."""

from __future__ import annotations

from pathlib import Path

import yaml
from alert_stack import DEPLOY, RULES, SCALED, scaled_rules, victoria_metrics_args, vmalert_args  # type: ignore[import-not-found]

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def flags(args: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in args)


def test_compose_runs_the_flags_deploy_ships() -> None:
    services = yaml.safe_load((COMPOSE / "docker-compose.alerting.yml").read_text())["services"]
    vm, vmalert = flags(services["victoria-metrics"]["command"]), flags(services["vmalert"]["command"])
    shipped_vm, shipped_vmalert = flags(victoria_metrics_args()), flags(vmalert_args())
    assert set(vm) == set(shipped_vm) and set(vmalert) == set(shipped_vmalert)
    # The values that are not a place (a path, an address) are the same.
    for name in ("-retentionPeriod", "-search.latencyOffset"):
        assert vm[name] == shipped_vm[name], name
    assert vmalert["-evaluationInterval"] == shipped_vmalert["-evaluationInterval"]
    assert vmalert["-rule"].endswith(Path(shipped_vmalert["-rule"]).name) and RULES.name == Path(vmalert["-rule"]).name


def test_compose_scrapes_and_routes_as_deploy_does() -> None:
    def without_targets(path: Path) -> dict[str, object]:
        config = yaml.safe_load(path.read_text())
        for job in config["scrape_configs"]:
            job.pop("static_configs")
        return dict(config)

    assert without_targets(COMPOSE / "alerting" / "scrape.yml") == without_targets(DEPLOY / "scrape.yml")
    sources = (COMPOSE / "alerting" / "alertmanager.yml", DEPLOY / "alertmanager.yml")
    routes = [yaml.safe_load(path.read_text()) for path in sources]
    assert routes[0]["route"] == routes[1]["route"]
    assert [r["name"] for r in routes[0]["receivers"]] == [r["name"] for r in routes[1]["receivers"]]


def test_every_rule_is_scaled_on_purpose_and_its_expression_kept() -> None:
    shipped = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    scaled = {r["alert"]: r for g in yaml.safe_load(scaled_rules(RULES.read_text()))["groups"] for r in g["rules"]}
    assert set(shipped) == set(scaled) == set(SCALED)
    for name, rule in shipped.items():
        assert scaled[name]["labels"] == rule["labels"] and scaled[name]["annotations"] == rule["annotations"]
        expr = rule["expr"]
        for old, new in SCALED[name].items():
            expr = expr.replace(old, new) if old != "for" else expr
        assert scaled[name]["expr"] == expr, name  # nothing else of the expression changed

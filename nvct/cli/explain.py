"""``nvct explain``: what a container would get in the configured mode, and why; writes nothing."""

from __future__ import annotations

import json
import os

import click

from nvct.cli import load_config


@click.command("explain", help="Show what a GPU container would get: the mode and why, the resolved request, "
               "every device node, mount, env var and hook with its reason, and NVIDIA_REQUIRE_* verdicts. "
               "Give a bundle (its config.json) or describe the container with -e/--mount/--annotation. "
               "Nothing is written; exit status 1 if the container would not start.")
@click.option("--bundle", metavar="DIR", help="An OCI bundle: its config.json is read, never written.")
@click.option("-e", "--env", "env", multiple=True, metavar="K=V", help="An env var of the container; repeatable.")
@click.option("--privileged", is_flag=True, help="The container has CAP_SYS_ADMIN.")
@click.option("--mount", "mounts", multiple=True, metavar="SRC:DST", help="A bind mount; repeatable.")
@click.option("--annotation", "annotations", multiple=True, metavar="K=V", help="An annotation; repeatable.")
@click.option("--diff", "show_diff", is_flag=True, help="Print the config.json change as a unified diff.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--gpus", "gpus", metavar="VALUE", help="Instead: which path CLI run --gpus VALUE takes on this node "
              "(the NVIDIA hook, or CDI names resolved in the engine's spec directories).")
@click.option("--cli", "cli", type=click.Choice(["docker", "ctr", "nerdctl", "podman"]), default="docker",
              show_default=True,
              help="The CLI whose --gpus is explained.")
@click.option("--docker-socket", default="/var/run/docker.sock", show_default=True, metavar="SOCKET",
              help="dockerd's socket (its program and PATH decide docker's path).")
@click.option("--docker-config", default="/etc/docker/daemon.json", show_default=True, metavar="FILE",
              help="dockerd's config (features.cdi, cdi-spec-dirs).")
@click.pass_context
def explain_command(ctx, bundle, env, privileged, mounts, annotations, show_diff, as_json, gpus, cli,
                    docker_socket, docker_config):
    from nvct.doctor import explain, explainview
    from nvct.doctor.rewritten import unrewrite
    from nvct.oci import spec as ocispec

    if gpus is not None:
        _explain_gpus(cli, gpus, docker_socket, docker_config, as_json)
    if not bundle and not env:
        raise click.UsageError("give --bundle DIR, or the container's env with -e K=V")
    config = load_config(ctx)
    base, rewritten = unrewrite(ocispec.load(bundle), config, bundle=bundle) if bundle else (None, [])
    spec = explain.spec_from_options(env, privileged=privileged, mounts=mounts, annotations=annotations, base=base)
    result = explain.explain(spec, config, bundle=bundle, rewritten=rewritten)
    if as_json:
        click.echo(json.dumps(explainview.to_json(result, diff=show_diff), indent=2))
    else:
        click.echo(explainview.render_text(result, diff=show_diff), nl=False)
    raise SystemExit(1 if result.error else 0)


def _explain_gpus(cli: str, value: str, docker_socket: str, docker_config: str, as_json: bool) -> None:
    from nvct.doctor import clipaths, explain, explainview
    from nvct.doctor.model import DEFAULT_PATH

    route, dirs = clipaths.on_this_node(cli, path_env=os.environ.get("PATH") or DEFAULT_PATH,
                                        docker_socket=docker_socket, docker_config=docker_config)
    result = explain.explain_gpus(cli, value, route, dirs)
    if as_json:
        out = dict(result)
        if out.get("edits") is not None:
            out["edits"] = explainview._edits_json(out["edits"], {})
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(explainview.render_gpus(result), nl=False)
    raise SystemExit(1 if result["error"] else 0)

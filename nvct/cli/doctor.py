"""``nvct doctor``: check driver, device nodes, libraries, config, engines, CDI and cgroups."""

from __future__ import annotations

import click


@click.command("doctor", help="Check the whole GPU container chain on this node; change nothing. "
               "One line per finding (ok, info, warn, fail) with the fix; exit status 1 if anything fails.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--deep", is_flag=True, help="Also ask NVML about each GPU (opens the GPUs: may take seconds).")
@click.option("--docker-config", default="/etc/docker/daemon.json", show_default=True, metavar="FILE")
@click.option("--docker-socket", default="/var/run/docker.sock", show_default=True, metavar="SOCKET",
              help="dockerd's socket: its listener is the dockerd whose PATH --gpus depends on.")
@click.option("--docker-pidfile", default="/var/run/docker.pid", show_default=True, metavar="FILE")
@click.option("--containerd-config", default="/etc/containerd/config.toml", show_default=True, metavar="FILE",
              help="containerd's config (its imports are read too).")
@click.option("--crio-dir", default="/etc/crio/crio.conf.d", show_default=True, metavar="DIR",
              help="cri-o's drop-in directory (crio.conf beside it is read too).")
@click.option("--cdi-dir", "cdi_dirs", multiple=True, metavar="DIR",
              help="CDI spec directory; repeatable (default: the config's spec-dirs).")
@click.option("--toolkit-dir", "toolkit_dirs", multiple=True, metavar="DIR",
              help="Where `nvct toolkit install` put the toolkit (stand-ins of a removed one stay there); repeatable "
                   "(default: /usr/local/nvidia/toolkit).")
@click.pass_context
def doctor_command(ctx, as_json, deep, docker_config, docker_socket, docker_pidfile, containerd_config,
                   crio_dir, cdi_dirs, toolkit_dirs):
    from nvct import doctor

    root = ctx.find_root().obj or {}
    options = doctor.Options(config_path=root.get("config_path"), deep=deep, docker_config=docker_config,
                             docker_socket=docker_socket, docker_pidfile=docker_pidfile,
                             containerd_config=containerd_config, crio_dir=crio_dir, cdi_dirs=tuple(cdi_dirs))
    if toolkit_dirs:
        options.toolkit_dirs = tuple(toolkit_dirs)
    findings = doctor.run(options)
    click.echo(doctor.render_json(findings) if as_json else doctor.render_text(findings), nl=False)
    raise SystemExit(doctor.exit_code(findings))

"""`tune ui`: the MLflow UI on the project's store, refused on a store that is not there."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from tuner.cli.console import console, friendly_errors


def ui(
    tracking_uri: Annotated[
        str | None,
        typer.Option(help="MLflow store to browse; default: ./mlruns/mlflow.db (the store `tune` writes here)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 5000,
) -> None:
    """Open the MLflow UI on the project's store (compare trials, profiles, the registered winner).

    Refuses to start on a store that does not exist (it would serve an empty one).

    Example: cd my-project && tune ui --port 5001"""
    from tuner.common.options import check_tracking_uri
    from tuner.tracking.store import check_store_schema, default_tracking_uri, describe_store, local_store
    from tuner.tracking.ui import serve_ui, training_view_url, ui_command

    with friendly_errors():
        if tracking_uri is not None:
            check_tracking_uri(tracking_uri)
    uri = tracking_uri or default_tracking_uri()
    store = local_store(uri)
    if store is not None and not store.exists():
        console.print(
            f"[red]error:[/red] no MLflow store at {escape(str(store.resolve()))}: run `tune` here first, change to "
            "the folder that holds mlruns/, or pass --tracking-uri sqlite:///PATH/mlruns/mlflow.db"
        )
        raise typer.Exit(2)
    with friendly_errors():
        check_store_schema(uri)
    console.print(
        f"MLflow UI: {training_view_url(uri, host, port)}  (this link opens the model-training view; "
        "without it a browser opens the view it last used, GenAI at first: switch with the sidebar's "
        "GenAI / Model training toggle)",
        markup=False,
    )
    console.print(f"store: {describe_store(uri)}", markup=False)
    raise typer.Exit(serve_ui(ui_command(uri, host, port)))

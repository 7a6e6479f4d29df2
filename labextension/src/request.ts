import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** Thrown for a non-2xx answer; `message` is the server's one-line `{"message"}` when present. */
export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

/**
 * Call the jupyter_pause REST API (`<base_url>/jupyter-pause/api/<endPoint>`).
 * ServerConnection.makeRequest adds the token and the XSRF header.
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'jupyter-pause', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as any);
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (e.g. an HTML 404 page): keep the text for the message below.
    }
  }
  if (!response.ok) {
    let message = data && typeof data === 'object' ? data.message || data.reason : '';
    if (!message) {
      message =
        response.status === 404
          ? 'the jupyter_pause server extension is not running on this server'
          : `${response.status} ${response.statusText}`;
    }
    throw new APIError(String(message), response.status);
  }
  return data as T;
}

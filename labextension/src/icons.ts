import { LabIcon } from '@jupyterlab/ui-components';

// jp-icon3 / jp-icon-accent* classes let the theme colour the paths (light and dark).
const pauseSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="6" y="5" width="4" height="14" rx="1"/>
    <rect x="14" y="5" width="4" height="14" rx="1"/>
  </g>
</svg>`;

const resumeSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 5.5v13a1 1 0 0 0 1.53.85l10.2-6.5a1 1 0 0 0 0-1.7L8.53 4.65A1 1 0 0 0 7 5.5z"/>
  </g>
</svg>`;

export const pauseIcon = new LabIcon({
  name: 'jupyter-pause:pause',
  svgstr: pauseSvg
});
export const resumeIcon = new LabIcon({
  name: 'jupyter-pause:resume',
  svgstr: resumeSvg
});
